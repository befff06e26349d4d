"""The public API of `diag` (diag/__init__.py): every name resolves to its module's object,
importing `diag` (as the collectors do, for `diag.contract.schema`) stays light, and the dashboard
reaches diag only through the API and the run-format constants of `diag.contract.schema`."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import diag

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pandas", "numpy", "pyarrow", "click", "diag.api", "diag.metrics", "diag.outputs.report")


@pytest.mark.parametrize("name", diag.__all__)
def test_every_public_name_is_its_modules_object(name: str) -> None:
    home = importlib.import_module(diag._HOME[name])
    assert getattr(diag, name) is getattr(home, name)
    assert name in dir(diag)


def test_the_api_lists_what_it_serves() -> None:
    assert sorted(diag.__all__) == sorted(diag._HOME)
    assert diag.REPORT_SCHEMA == "diag.report/1"
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = diag.nothing_here  # type: ignore[attr-defined]  # what the test is about
    from diag.contract import schema  # a submodule is still imported as one

    assert schema.REPORT_SCHEMA == diag.REPORT_SCHEMA


def test_importing_diag_schema_imports_no_analysis() -> None:
    probe = (
        "import sys, diag.contract.schema; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == ""


def _diag_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diag"):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("diag")]
    return found


def test_the_dashboard_uses_only_the_api_and_the_schema() -> None:
    reached = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in sorted((ROOT / "dashboard").rglob("*.py"))
        for module in _diag_imports(path)
        if module not in ("diag", "diag.contract", "diag.contract.schema")
    }
    assert reached == set()
