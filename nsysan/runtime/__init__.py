"""How nsysan runs as a process: the C allocator's settings for the command and its workers,
Ctrl-C while the command starts, and how much memory an analysis may take."""
