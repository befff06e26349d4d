"""The architecture, checked from the source (docs/architecture.md): each folder of `diag`, and each
package beside it, imports only what its stage may (`MAY_IMPORT`, with the few exceptions named in
`EXCEPTIONS`); no import cycle, `TYPE_CHECKING` imports included; no module imports another's
`_private` name; the dashboard reaches diag through its public names; the folder list of
docs/architecture.md is the tree.

The imports are read from the source with `ast`, those inside functions and under `if
TYPE_CHECKING:` included (a deferred or a typing-only import hides coupling from the interpreter,
not from the design). `diag`'s commands are added by name (diag/cli/main.py imports `simulator.cli`
as a string when `diag simulate` is asked for): no import to check.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import diag

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("diag", "collectors", "simulator", "dashboard", "reference_runs")

DIAG_FOLDERS = ("contract", "rankfile", "read", "numeric", "metrics", "whatif", "rules", "plan",
                "outputs", "cli")  # fmt: skip
"""The folders of diag/, in the order data flows through them (docs/architecture.md)."""
DIAG_MODULES = ("api", "errors")
"""The modules at diag/'s top beside its __init__ and __main__."""

ALL_OF_DIAG = frozenset({*DIAG_FOLDERS, *DIAG_MODULES, "diag"})
MAY_IMPORT: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "contract": frozenset(),
    "numeric": frozenset(),
    "rankfile": frozenset({"contract", "errors"}),
    "read": frozenset({"contract", "errors", "rankfile", "numeric"}),
    "whatif": frozenset({"contract", "numeric", "read"}),
    "metrics": frozenset({"contract", "errors", "numeric", "rankfile", "read", "whatif"}),
    "rules": frozenset({"contract", "numeric", "read", "metrics", "whatif"}),
    "outputs": frozenset({"contract", "errors", "read", "metrics", "whatif", "rules"}),
    "plan": frozenset({"contract", "errors", "whatif", "simulator"}),
    "api": frozenset({"contract", "errors", "read", "metrics", "rules", "outputs"}),
    "cli": ALL_OF_DIAG - {"cli"} | {"dashboard"},
    "diag": ALL_OF_DIAG - {"diag"},  # the public names, imported on first use
    "collectors": frozenset({"contract", "rankfile"}),
    "simulator": frozenset({"contract", "rankfile"}),
    "dashboard": frozenset({"diag", "contract"}),
    "reference_runs": frozenset({"collectors", "contract"}),
}
"""Unit (a folder of diag, a module at its top, or a package beside it) -> the other units it may
import. Anything not listed (pandas, torch, ...) is not this test's business; that the contract is
standard library only is checked below by importing it."""

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("diag.rules", "diag.outputs.units"): "the rules word their titles with the units' rank "
    "phrases (`ranks_phrase`), as every rendering does",
    ("simulator.cli", "diag.cli.options"): "`diag simulate` is one of diag's commands: it "
    "shares the one-line error and the --layout parser",
    ("simulator.cli", "diag.errors"): "the same: the command's unusable input is an InputError",
}
"""(importer, or the package it is in; imported module) -> why the import crosses the rules."""


def modules(package: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of `package` (a top-level folder)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of the module, at any depth, `TYPE_CHECKING` blocks included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


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


def import_graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports."""
    mods = {name: path for package in packages for name, path in modules(package).items()}
    known = set(mods)
    return {name: imported(name, path, known) & known - {name} for name, path in mods.items()}


def unit(module: str) -> str:
    """The unit a module belongs to: `diag.read.kineto.files` -> read, `diag.api` -> api,
    `diag.__main__` -> cli, `collectors.recorder` -> collectors."""
    parts = module.split(".")
    if parts[0] != "diag":
        return parts[0]
    if len(parts) == 1:
        return "diag"
    return "cli" if parts[1] == "__main__" else parts[1]


def _excepted(importer: str, target: str) -> bool:
    return any(
        (importer == who or importer.startswith(who + ".")) and target == what
        for who, what in EXCEPTIONS
    )


def stage_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import that crosses MAY_IMPORT, as `importer -> imported (unit -> unit)`."""
    found = []
    for importer, targets in sorted(graph.items()):
        own = unit(importer)
        for target in sorted(targets):
            other = unit(target)
            if other == own or other in MAY_IMPORT.get(own, frozenset()):
                continue
            if not _excepted(importer, target):
                found.append(f"{importer} -> {target} ({own} -> {other})")
    return found


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


def private_crossings(name: str, path: Path, ours: set[str]) -> list[str]:
    """The `_private` names module `name` takes from another of our modules: `from m import _x`, or
    `m._x` where `m` is a module of ours it imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found, bound = [], {}
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ours:
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name
        elif node.module and node.module.split(".")[0] in ours and not node.level:
            for alias in node.names:
                if _is_private(alias.name) and node.module != name:
                    found.append(f"{name}: from {node.module} import {alias.name}")
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and _is_private(node.attr)
        ):
            found.append(f"{name}: {bound[node.value.id]}.{node.attr}")
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


# --- the checkers themselves -------------------------------------------------------------------


def test_the_cycle_finder_finds_cycles_and_only_them() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_typing_blocks_and_relative_imports_count(tmp_path: Path) -> None:
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
    assert imported("pkg.mod", path, known) == {
        "pkg.sibling", "pkg.sub", "pkg.late", "pkg.typed", "typing"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("importer", "target"),
    [
        ("diag.read.sources.run_directory", "diag.metrics"),  # a reader running metric code
        ("diag.cli.plan", "simulator.config"),  # only diag.plan imports the simulator
        ("collectors.recorder", "diag.read.load"),  # the writers import the contract only
        ("simulator.engine", "diag.metrics.flops"),
        ("dashboard.app", "diag.read.load"),  # the dashboard: diag's public names only
        ("diag.contract.schema", "diag.rankfile.records"),  # the contract: standard library
        ("diag.metrics.summary", "diag.rules.engine"),  # data flows forward, never back
    ],
)
def test_an_offending_import_is_caught(importer: str, target: str) -> None:
    graph = {name: set(targets) for name, targets in import_graph().items()}
    assert not stage_violations(graph)
    graph[importer].add(target)
    assert stage_violations(graph) == [
        f"{importer} -> {target} ({unit(importer)} -> {unit(target)})"
    ]


def test_a_cycle_hidden_behind_type_checking_is_caught(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import thing\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import other\n"
    )
    known = {"pkg", "pkg.a", "pkg.b"}
    graph = {m: imported(m, package / f"{m[4:]}.py", known) & known - {m} for m in known - {"pkg"}}
    assert import_cycles(graph) == [["pkg.a", "pkg.b"]]


def test_a_private_name_taken_from_another_module_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text(
        "from diag.read import load\nfrom diag.read.load import _quiet, RunData\n"
        "print(load._hidden, load.RunData, RunData)\n"
    )
    assert private_crossings("diag.read.mod", path, set(PACKAGES)) == [
        "diag.read.mod: from diag.read.load import _quiet",
        "diag.read.mod: diag.read.load._hidden",
    ]


# --- the tree -------------------------------------------------------------------------------------


def test_every_folder_imports_only_what_its_stage_may() -> None:
    violations = stage_violations(import_graph())
    assert not violations, "imports across the stages:\n" + "\n".join(violations)


def test_no_import_cycle_typing_imports_included() -> None:
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(map(_spelled, cycles))


def test_no_module_imports_another_modules_private_name() -> None:
    ours = set(PACKAGES)
    found = [
        crossing
        for package in PACKAGES
        for name, path in modules(package).items()
        for crossing in private_crossings(name, path, ours)
    ]
    assert not found, "private names across modules:\n" + "\n".join(found)


def test_the_dashboard_takes_only_diags_public_names() -> None:
    """`from diag import X` in the dashboard names only what diag/__init__.py serves; beyond it the
    dashboard reads the run format's constants (diag.contract)."""
    found = []
    for name, path in modules("dashboard").items():
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "diag":
                found += [f"{name}: {a.name}" for a in node.names if a.name not in diag.__all__]
    assert not found, f"the dashboard imports names diag does not serve: {found}"


def test_every_unit_of_the_tree_has_its_rules() -> None:
    """A new folder (or a module at diag/'s top) must say what it may import."""
    tree = {unit(m) for package in PACKAGES for m in modules(package)}
    assert tree == set(MAY_IMPORT)
    on_disk = {p.name for p in (ROOT / "diag").iterdir() if (p / "__init__.py").is_file()}
    assert on_disk == set(DIAG_FOLDERS)
    top = {p.stem for p in (ROOT / "diag").glob("*.py")} - {"__init__", "__main__"}
    assert top == set(DIAG_MODULES)


def test_docs_architecture_lists_the_tree() -> None:
    """docs/architecture.md's folder table names every folder of diag/ and the packages beside it,
    in its first column (`diag/read/`, `collectors/`), and nothing else."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([a-z_/]+)/` \|", text, flags=re.MULTILINE))
    expected = {f"diag/{folder}" for folder in DIAG_FOLDERS} | set(PACKAGES) - {"diag"}
    assert listed == expected


@pytest.mark.parametrize("package", ["diag", "simulator", "collectors"])
def test_no_module_imports_the_reference_trainers(package: str) -> None:
    offenders = {
        name: sorted(m for m in imported(name, path, set()) if m.split(".")[0] == "reference_runs")
        for name, path in modules(package).items()
    }
    offenders = {name: found for name, found in offenders.items() if found}
    assert not offenders, f"{package} must not import reference_runs: {offenders}"


def test_what_training_processes_import_from_diag_is_standard_library_only() -> None:
    """The collectors and the trainers import the contract inside every rank: no pandas, numpy or
    torch behind any of its modules."""
    shared = sorted(modules("diag/contract"))
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        f"for name in {shared!r}:\n"
        "    __import__(name.replace('/', '.'))\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert ast.literal_eval(result.stdout.strip()) == ["diag"]
