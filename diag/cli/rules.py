"""`diag rules`: the rule catalogue from the registry, as text, as Markdown (docs/rules.md is
`diag rules --markdown`), and one rule explained (`diag rules explain CODE`)."""

from __future__ import annotations

import click

from diag.cli.shell import fail
from diag.errors import InputError
from diag.outputs.report_lines import PATTERN_NAMES
from diag.rules import REGISTRY, Rule
from diag.rules.engine import DOC_SECTIONS, SEVERITIES

REGENERATE = "diag rules --markdown > docs/rules.md"


# The order of findings in one sentence: the README and docs/cli.md quote it word for word
# (tests/unit/test_rules_cli.py checks), docs/rules.md and `diag rules` print it.
RANKING_ORDER = (
    "Findings are ranked so that the first is the main diagnosis: the failure findings (FLR: the"
    " job hung, crashed, desynchronised, lost a rank or ended undecidably) first, then high"
    " findings about whether the job runs or learns right (memory, MoE quality, pitfalls), then"
    " by severity; within a severity, findings that explain others come first, then by cost"
    " (the step time that removing the cause saves, largest first, findings without a cost"
    " after those with one), then"
    " collapse patterns before pitfalls, then the stronger evidence, then the rule code."
)

RANKING_POLICY = (
    RANKING_ORDER,
    "A finding that names the cause of others takes the highest severity among them: the cause is",
    "the diagnosis, its consequences are evidence. The high findings that come first are those of",
    "collapse patterns 4 (MoE quality) and 5 (memory: an OOM that happened, a budget the run",
    "crosses or is about to) and pitfalls (a NaN loss, a sampler never re-seeded).",
    "Every finding of patterns 1-3 whose cause the what-if replay can remove (docs/metrics.md,",
    '"Attribution") carries `cost_s` (step time saved per step) and `cost_share` (of the measured',
    "step); its severity is the lower of the rule's own and the one the share earns: `high` from",
    "25%, `medium` from 10%, `low` below (noise cannot make a verdict worse than its evidence)",
    "(a `[cost]` table overrides `high` and `medium`; COM001-COM003 grade with their own",
    "share thresholds). Communication findings claim only transfer time: the time a rank waits",
    "for a late peer is the late rank's (BAL001, BAL005), the stage's (PIP003) or the data's",
    "(BAL004). A rank's excess is one cause, host time or compute by what removing each saves",
    "more: where it is host time (BAL005, the whole saving), a busy-time finding on the same rank",
    "(BAL001) claims only what its compute at the peers' median saves.",
    "Memory (pattern 5), MoE quality (4) and pitfalls keep their own severity classes.",
    "Where the evidence leaves time in no record open (a rank's own work, or waiting for a peer:",
    "its group's ranks resumed closer together than they arrived, not together), the replay",
    "runs both readings and the finding's cost is a range, `cost_range_s` (`cost_s` reads that",
    "time as the rank's own); the cost then lowers its severity only as far as the high end",
    "allows.",
)


def pattern_label(rule: Rule) -> str:
    """`3 speedup below theory`, or `pitfall`."""
    name = PATTERN_NAMES.get(rule.pattern, "?")
    return name if rule.pattern is None else f"{rule.pattern} {name}"


def severity_range(rule: Rule) -> str:
    """The severities a rule can give, when its thresholds are named after them (`medium-high`);
    declared as `severities` on the rule when the registry knows them; else empty."""
    declared = getattr(rule, "severities", None)
    levels = [s for s in SEVERITIES if s in (declared or rule.thresholds)]
    if not levels:
        return ""
    return levels[0] if len(levels) == 1 else f"{levels[-1]}-{levels[0]}"


def summary_line(rule: Rule) -> str:
    """The docstring's first line, else the first sentence of its Symptom."""
    first = rule.doc.strip().splitlines()[0].strip() if rule.doc.strip() else ""
    if first and first.rstrip(":") not in DOC_SECTIONS:
        return first
    return rule.section("Symptom").split(". ")[0]


def find_rule(key: str) -> Rule:
    """A rule by code (case-insensitive) or dotted name; InputError naming `key` otherwise."""
    by_name = {r.name: r for r in REGISTRY.values()}
    found = REGISTRY.get(key.upper()) or by_name.get(key)
    if found is None:
        raise InputError(key, "no rule has this code or name (see `diag rules`)")
    return found


def catalogue_text() -> str:
    rows = [["code", "name", "pattern", "severity", "symptom"]]
    rows += [
        [r.code, r.name, pattern_label(r), severity_range(r) or "-", summary_line(r)]
        for r in _ordered()
    ]
    sizes = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join([*(c.ljust(s) for c, s in zip(row, sizes, strict=False)), row[4]])
             for row in rows]  # fmt: skip
    return "\n".join([*lines, "", RANKING_ORDER]) + "\n"


def explain_text(rule: Rule) -> str:
    lines = [f"{rule.code}  {rule.name}  (pattern: {pattern_label(rule)})", summary_line(rule)]
    for title in DOC_SECTIONS:
        lines += ["", f"{title}:", f"  {rule.section(title)}"]
    lines += ["", "Thresholds (override in TOML: [rules." + rule.code + "]):"]
    if not rule.thresholds:
        lines.append("  none")
    for name, threshold in rule.thresholds.items():
        lines.append(f"  {name} = {threshold.default:g} {threshold.unit}: {threshold.help}")
    return "\n".join(lines) + "\n"


def catalogue_markdown() -> str:
    """The whole catalogue as Markdown: a table, then each rule's sections and thresholds."""
    lines = [
        "# Rule catalogue",
        "",
        f"Generated from the rule registry by `{REGENERATE}`; do not edit by hand.",
        "Thresholds are overridden in a TOML file passed with `--config`, as `[rules.CODE]`",
        'or `[rules."dotted.name"]` tables.',
        "",
        "## Ranking",
        "",
        *RANKING_POLICY,
        "",
        "| code | name | pattern | severity | symptom |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| [{r.code}](#{r.code.lower()}) | `{r.name}` | {pattern_label(r)} | "
        f"{severity_range(r) or '-'} | {_cell(summary_line(r))} |"
        for r in _ordered()
    ]
    for r in _ordered():
        lines += ["", f"## {r.code}", "", f"`{r.name}`, pattern: {pattern_label(r)}.", ""]
        lines += [summary_line(r), ""]
        for title in DOC_SECTIONS:
            lines.append(f"- **{title}**: {r.section(title)}")
        if r.thresholds:
            lines += ["", "| threshold | default | unit | meaning |", "|---|---|---|---|"]
            lines += [
                f"| `{name}` | {t.default:g} | {t.unit} | {_cell(t.help)} |"
                for name, t in r.thresholds.items()
            ]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _ordered() -> list[Rule]:
    return [REGISTRY[code] for code in sorted(REGISTRY)]


@click.group(invoke_without_command=True)
@click.option("--markdown", is_flag=True, help=f"The catalogue as Markdown ({REGENERATE}).")
@click.pass_context
def rules(ctx: click.Context, markdown: bool) -> None:
    """List the rule catalogue: code, name, collapse pattern, severities, symptom."""
    if ctx.invoked_subcommand is None:
        click.echo(catalogue_markdown() if markdown else catalogue_text(), nl=False)


@rules.command()
@click.argument("code")
def explain(code: str) -> None:
    """Explain one rule (by code, e.g. COM001, or dotted name): its doc and thresholds."""
    try:
        click.echo(explain_text(find_rule(code)), nl=False)
    except InputError as error:
        fail(error)
