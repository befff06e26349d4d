"""The direction of the imports (DESIGN.md, "Layout"): no import cycle among the modules of `diag`,
and neither `diag` nor the simulator imports the reference trainers (they share the names, schedules
and injection specs of diag/contract/names.py, diag/contract/schedules.py,
diag/contract/injections.py).

The imports are read from the source with `ast`, those inside functions included (a deferred
import hides a cycle from the interpreter, not from the design); imports under
`if TYPE_CHECKING:` are left out, since they never run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

KNOWN_CYCLES: dict[frozenset[str], str] = {}
"""Cycles tolerated for now (an expected failure, not a failure), each with a message naming it,
e.g. `{frozenset({"diag.read.load", "diag.metrics"}): "diag.read.load <-> diag.metrics: ..."}` (that
one is gone); a cycle made of other modules, or of more of them, fails."""


def modules(package: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of `package` (a top-level folder)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of the module, at any depth, but those under TYPE_CHECKING."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules that module `name` (at `path`) imports: dotted names, as written (an
    `import a.b` names a.b; `from a import b` names a.b when that is a module, else a)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:  # relative: from the module's package, `level` packages up
            package = name.split(".") if is_package else name.split(".")[:-1]
            anchor = package[: len(package) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        for alias in node.names:
            full = f"{base}.{alias.name}"
            out.add(full if full in known else base)
    return out


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    mods = modules(package)
    known = set(mods)
    return {name: imported(name, path, known) & known - {name} for name, path in mods.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one cycle
    through its modules in import order, starting at its smallest name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(graph, component) for component in components]


def _cycle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A path of imports inside `component` from its smallest module back to it."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way round
        node = frontier.pop(0)
        for nxt in sorted(graph[node] & component):
            if nxt == start:
                return paths[node]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                frontier.append(nxt)
    raise AssertionError(f"no cycle through {sorted(component)}")


def _spelled(cycle: list[str]) -> str:
    return " -> ".join([*cycle, cycle[0]])


def test_the_cycle_finder_finds_cycles_and_only_them() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_and_relative_imports_count(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from .sub import thing\n"
        "if TYPE_CHECKING:\n"
        "    import pkg.typed\n"
        "def f():\n"
        "    import pkg.late\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(source)
    known = {"pkg", "pkg.mod", "pkg.sibling", "pkg.sub", "pkg.late", "pkg.typed"}
    assert imported("pkg.mod", path, known) == {"pkg.sibling", "pkg.sub", "pkg.late", "typing"}


def test_no_import_cycle_among_diag_modules() -> None:
    cycles = import_cycles(import_graph("diag"))
    unknown = [c for c in cycles if frozenset(c) not in KNOWN_CYCLES]
    assert not unknown, "import cycles among diag modules: " + "; ".join(map(_spelled, unknown))
    known = [KNOWN_CYCLES[frozenset(c)] for c in cycles if frozenset(c) in KNOWN_CYCLES]
    if known:
        pytest.xfail("known import cycle: " + "; ".join(known))


@pytest.mark.parametrize("package", ["diag", "simulator"])
def test_no_module_imports_the_reference_trainers(package: str) -> None:
    offenders = {
        name: sorted(m for m in imported(name, path, set()) if m.split(".")[0] == "reference_runs")
        for name, path in modules(package).items()
    }
    offenders = {name: found for name, found in offenders.items() if found}
    assert not offenders, f"{package} must not import reference_runs: {offenders}"


def test_the_simulator_does_not_import_the_cli_back() -> None:
    """diag/cli/main.py adds `diag simulate` (simulator/cli.py): the simulator takes the pieces it
    shares with the CLI from diag/cli/options.py, not from diag.cli.main or diag.cli.shell."""
    cli = {"diag.cli.main", "diag.cli.shell"}
    offenders = {
        name: sorted(found)
        for name, path in modules("simulator").items()
        if (found := imported(name, path, set()) & cli)
    }
    assert not offenders, f"the simulator imports the CLI back: {offenders}"


def test_what_training_processes_import_from_diag_is_standard_library_only() -> None:
    """The collectors and the trainers import these inside every rank: no pandas, numpy or
    torch behind them."""
    shared = [
        "diag.contract.schema",
        "diag.contract.names",
        "diag.contract.injections",
        "diag.contract.schedules",
    ]
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        f"for name in {shared!r}:\n"
        "    __import__(name)\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert ast.literal_eval(result.stdout.strip()) == ["diag"]
