"""One module per command: each turns parsed arguments into output (and an exit code)."""
