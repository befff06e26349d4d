"""The public entry point of the analysis core: a path in, the report (JSON contract) out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diag.load import load_run
from diag.metrics import compute_metrics
from diag.report import build_report


def analyze_path(path: str | Path) -> dict[str, Any]:
    """Load a run directory, compute its metrics and build the `diag.report/1` report.

    Raises `diag.errors.InputError` (one line naming the file and the reason) on unusable input.
    """
    run = load_run(path)
    return build_report(run, compute_metrics(run))
