"""The cache key's import scan (a regular expression, diag/read/cache.py) finds every diag import
that Python's parser finds, in every module of diag: the key changes with any module the cached
tables depend on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from diag.read import cache

DIAG = Path(cache.__file__).parents[1]  # the diag package (cache.py is diag/read/cache.py)


def parsed_imports(path: Path) -> set[str]:
    """The diag modules `path` imports, by the parser (the reference the scan replaced)."""
    package = ".".join(path.relative_to(DIAG.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return {name for name in names if name.split(".")[0] == "diag"}


@pytest.mark.parametrize("path", sorted(DIAG.rglob("*.py")), ids=lambda p: str(p.relative_to(DIAG)))
def test_scan_finds_every_parsed_import(path: Path) -> None:
    assert parsed_imports(path) <= set(cache._diag_imports(path))


def test_scan_reads_the_forms_of_an_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "diag" / "sub"
    package.mkdir(parents=True)
    source = package / "mod.py"
    source.write_text(
        "import diag.a, diag.b as b  # a comment\n"
        "from diag.c import (  # the names (in parentheses)\n"
        "    d,\n    e as f,\n)\n"
        "def g():\n    from . import h\n    from ..i import j\n"
        "from diag.k import \\\n    l\n"
    )
    monkeypatch.setattr(cache, "_DIAG", tmp_path / "diag")
    found = set(cache._diag_imports(source))
    assert found == {
        "diag.a", "diag.b", "diag.c", "diag.c.d", "diag.c.e", "diag.sub", "diag.sub.h",
        "diag.i", "diag.i.j", "diag.k", "diag.k.l",
    }  # fmt: skip
