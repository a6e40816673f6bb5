"""One module per subcommand; each stays thin: parse options, call the library, render, exit code."""
