"""The `diag` command line (`main`) and one module per command; the shell over the API."""
