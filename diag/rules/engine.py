"""The rules engine: a registry of small pure rules over a run's tables and metrics.

A rule is a function `(ctx: RuleContext, limits: dict[str, float]) -> Iterable[Finding]`, registered
with `@rule(...)`: a stable code (`PP001`), a dotted name (`pipeline.bubble`), the collapse pattern
it evidences (1-5 of docs/physics.md, or None for a pitfall), its thresholds (defaults with units,
overridable from TOML), and a docstring with the sections Symptom / Likely cause / Fix / Evidence —
the registry refuses a rule without them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from diag.metrics import RunMetrics
from diag.read.load import RunData
from diag.rules.costs import COST_TABLE, attach_costs, cost_limits
from diag.rules.model import SEVERITIES, Finding, Threshold, grade

__all__ = [
    "DOC_SECTIONS",
    "REGISTRY",
    "SEVERITIES",
    "Diagnosis",
    "Finding",
    "Rule",
    "RuleContext",
    "Threshold",
    "check_config",
    "grade",
    "limits_for",
    "rank_findings",
    "rule",
    "run_rules",
]  # fmt: skip

DOC_SECTIONS = ("Symptom", "Likely cause", "Fix", "Evidence")
CODE_RE = re.compile(r"^[A-Z]{2,4}\d{3}$")


@dataclass
class RuleContext:
    """What a rule may read: the loaded tables and the computed metrics (no files, no torch),
    and every rule's thresholds as configured (`limits`, by code: a rule that asks whether
    another's finding explains its own reads that rule's limits, not its defaults)."""

    run: RunData
    metrics: RunMetrics
    limits: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    derived: dict[str, Any] = field(default_factory=dict)
    """What several rules derive from the same run (the stragglers), computed once a run."""

    def limits_of(self, code: str) -> Mapping[str, float]:
        """Rule `code`'s thresholds as configured; its defaults where none were given."""
        found = self.limits.get(code)
        return found if found is not None else limits_for(REGISTRY[code], None)

    def derived_once(self, name: str, compute: Callable[[], Any]) -> Any:
        """`compute()` the first time `name` is asked of this run, the kept value after."""
        if name not in self.derived:
            self.derived[name] = compute()
        return self.derived[name]


RuleFn = Callable[[RuleContext, Mapping[str, float]], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    pattern: int | None
    thresholds: dict[str, Threshold]
    fn: RuleFn
    doc: str

    def section(self, title: str) -> str:
        """The text of one docstring section (Symptom, Likely cause, Fix, Evidence)."""
        return _sections(self.doc).get(title, "")


REGISTRY: dict[str, Rule] = {}


def _sections(doc: str) -> dict[str, str]:
    found: dict[str, list[str]] = {}
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        head = stripped.rstrip(":")
        if stripped.endswith(":") and head in DOC_SECTIONS:
            current = head
            found[current] = []
        elif current is not None:
            found[current].append(stripped)
    return {k: " ".join(v).strip() for k, v in found.items()}


def rule(
    code: str,
    name: str,
    pattern: int | None,
    thresholds: dict[str, Threshold] | None = None,
) -> Callable[[RuleFn], RuleFn]:
    """Register a rule; raises ValueError for a bad code, a duplicate or a missing doc section."""

    def register(fn: RuleFn) -> RuleFn:
        doc = fn.__doc__ or ""
        if not CODE_RE.match(code):
            raise ValueError(f"rule code {code!r} must look like PP001")
        if code in REGISTRY:
            raise ValueError(f"rule code {code} registered twice")
        if pattern is not None and pattern not in (1, 2, 3, 4, 5):
            raise ValueError(f"{code}: pattern must be 1-5 or None, got {pattern!r}")
        sections = _sections(doc)
        missing = [s for s in DOC_SECTIONS if not sections.get(s)]
        if missing:
            raise ValueError(f"{code}: docstring lacks the section(s) {', '.join(missing)}")
        REGISTRY[code] = Rule(code, name, pattern, dict(thresholds or {}), fn, doc)
        return fn

    return register


def limits_for(rule_: Rule, config: Mapping[str, Any] | None) -> dict[str, float]:
    """The rule's thresholds: defaults, overridden by `config[code]` or `config[name]` tables."""
    limits = {key: t.default for key, t in rule_.thresholds.items()}
    for key in (rule_.code, rule_.name):
        overrides = (config or {}).get(key) or {}
        for name, value in overrides.items():
            if name not in limits:
                raise ValueError(f"rule {rule_.code} has no threshold {name!r}")
            limits[name] = float(value)
    return limits


def check_config(config: Mapping[str, Any]) -> None:
    """ValueError naming the first table or threshold in `config` that no rule knows."""
    by_key = {**{r.code: r for r in REGISTRY.values()}, **{r.name: r for r in REGISTRY.values()}}
    for key, table in config.items():
        if key == COST_TABLE:  # the cost thresholds of every time finding (diag.rules.costs)
            cost_limits({key: table})
            continue
        if key not in by_key:
            raise ValueError(f"no rule is called {key!r} (see `diag rules`)")
        if not isinstance(table, Mapping):
            raise ValueError(f"[{key}] must be a table of thresholds")
        limits_for(by_key[key], {key: table})


_RANK = {"high": 0, "medium": 1, "low": 2}
RUNS_OR_LEARNS_PATTERNS = frozenset({4, 5})  # MoE quality, memory
PITFALL_PREFIX = "PIT"
FAILURE_PREFIX = "FLR"
"""The failure family (diag/rules/families/failure.py): the job did not finish."""


class Diagnosis(NamedTuple):
    """What the rules make of a run, beside its `RunMetrics` (which it does not change): the
    findings, ranked (the first is the main diagnosis), and notes on rules that could not judge
    (a rule that raised, with the error)."""

    findings: list[Finding]
    notes: list[str]


def run_rules(
    run: RunData,
    metrics: RunMetrics,
    config: Mapping[str, Any] | None = None,
    derived: Mapping[str, Any] | None = None,
) -> Diagnosis:
    """Every registered rule over one run, ranked: the first finding is the main diagnosis.
    Reads the run and its metrics, changes neither.

    Order (`rank_findings`): the failure findings (FLR: a hang, a crash, a desync, a lost
    rank, an undecidable end) first, whatever their severity; then high findings about
    whether the job runs or learns right (patterns 4
    and 5, pitfalls: `_blocks_training`) first; then severity; within a severity, findings that
    explain others present first, then the larger `cost_s` (None after every cost), then findings
    that name a collapse pattern before pitfalls, then the stronger evidence (a larger `margin`;
    None counts as 1), then code. Before the sort, a finding that names the cause of others
    (`explains`) takes the highest severity among them: the cause is the diagnosis, its consequences
    are evidence. `diag.cli.rules.RANKING_ORDER` says the same in one sentence. A rule that raises
    is reported as a note, never as a crash. `derived`: values the rules would derive from the
    run (`RuleContext.derived`), already known to the caller (a growing run keeps them as its
    steps come: `diag.LiveRun.derived`).
    """
    all_limits = {code: limits_for(rule_, config) for code, rule_ in REGISTRY.items()}
    ctx = RuleContext(run, metrics, all_limits, dict(derived or {}))
    findings: list[Finding] = []
    notes: list[str] = []
    for code in sorted(REGISTRY):
        rule_ = REGISTRY[code]
        limits = all_limits[code]
        try:
            found = list(rule_.fn(ctx, limits))
        except Exception as err:
            notes.append(f"rule {code} failed and was skipped: {err!r}")
            continue
        for finding in found:  # the rule's identity is its registration's, never its own
            finding.rule, finding.pattern = code, rule_.pattern
        findings.extend(found)
    attach_costs(findings, metrics.attribution, config, all_limits)
    return Diagnosis(rank_findings(findings), notes)


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """The order of `run_rules` (see there); raises an explaining finding's severity."""
    present = {f.rule: f for f in findings}
    explaining: set[int] = set()
    for f in findings:
        explained = [present[code] for code in f.explains if code in present and code != f.rule]
        if explained:
            explaining.add(id(f))
            f.severity = min((f, *explained), key=lambda g: _RANK[g.severity]).severity
    return sorted(
        findings,
        key=lambda f: (
            not f.rule.startswith(FAILURE_PREFIX),  # the job stopped: above everything
            not _blocks_training(f),
            _RANK[f.severity],
            id(f) not in explaining,
            -(f.cost_s if f.cost_s is not None else -1.0),
            f.pattern is None,
            -(f.margin or 1.0),
            f.rule,
        ),
    )


def _blocks_training(finding: Finding) -> bool:
    """A high finding about whether the job runs or learns right: memory (an OOM that
    happened, a budget crossed or about to be), MoE quality (tokens dropped, dead experts) or a
    pitfall (a NaN loss, a sampler never re-seeded). It outranks any speed finding."""
    if finding.severity != "high":
        return False
    return finding.pattern in RUNS_OR_LEARNS_PATTERNS or finding.rule.startswith(PITFALL_PREFIX)
