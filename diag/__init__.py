"""diag: the analysis core (loading, metrics, ledger, rules, reports) and the `diag` CLI.

Kept import-light: the collectors import `diag.schema` inside training processes.
"""

__version__ = "0.1.0"
