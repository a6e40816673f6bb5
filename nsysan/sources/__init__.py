"""Reading the files: the nsys export (found, run, cached), the schema probe, queries into frames,
the committed state of a SQLite file, nvidia-smi logs, the program's own OOM messages, and
analysis JSON documents read back. Only this package and events/ know nsys table names."""
