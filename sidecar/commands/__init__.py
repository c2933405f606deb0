"""The `sidecar` command line: one module per command family, `cli.py` the entry point."""
