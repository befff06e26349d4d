"""`diag rules` (catalogue, explain, --markdown and docs/rules.md) and how findings read in the
text, Markdown and HTML reports."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from diag.api import analyze_path
from diag.cli.main import main
from diag.cli.rules import RANKING_ORDER, REGENERATE, catalogue_markdown
from diag.outputs.report import render_html, render_markdown, render_text
from diag.rules import REGISTRY
from diag.rules.engine import DOC_SECTIONS

ROOT = Path(__file__).resolve().parents[2]
DOCS_RULES = ROOT / "docs" / "rules.md"


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_rules_lists_every_registered_rule() -> None:
    result = cli("rules")
    assert result.exit_code == 0, result.output
    table = result.stdout.partition("\n\n")[0]  # the order of findings follows the table
    lines = table.splitlines()
    assert lines[0].split() == ["code", "name", "pattern", "severity", "symptom"]
    assert [line.split()[0] for line in lines[1:]] == sorted(REGISTRY)
    com001 = next(line for line in lines if line.startswith("COM001"))
    assert "communication.exposed_share" in com001 and "1 more GPUs, slower" in com001
    assert "medium-high" in com001  # severities named by its thresholds


def test_the_order_of_findings_is_one_sentence_everywhere() -> None:
    """The README, docs/cli.md, docs/rules.md and `diag rules` state the order in the same words."""
    for path in (ROOT / "README.md", ROOT / "docs" / "cli.md", DOCS_RULES):
        text = path.read_text(encoding="utf-8")
        assert RANKING_ORDER in text, f"{path.name} does not state the order of findings as written"
    assert cli("rules").stdout.endswith(f"\n\n{RANKING_ORDER}\n")


def test_explain_prints_sections_and_thresholds() -> None:
    for key in ("COM001", "com001", "communication.exposed_share"):
        result = cli("rules", "explain", key)
        assert result.exit_code == 0, result.output
        text = result.stdout
        assert text.startswith("COM001  communication.exposed_share  (pattern: 1 more GPUs")
        for section in DOC_SECTIONS:
            assert f"\n{section}:\n  " in text
        assert "  high = 0.4 fraction: " in text and "  medium = 0.2 fraction: " in text


def test_explain_unknown_rule_exits_2_with_one_line() -> None:
    result = cli("rules", "explain", "XX999")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == "diag: error: XX999: no rule has this code or name (see `diag rules`)\n"


def test_markdown_catalogue_has_every_rule() -> None:
    result = cli("rules", "--markdown")
    assert result.exit_code == 0
    for rule in REGISTRY.values():
        assert f"\n## {rule.code}\n" in result.stdout
        assert f"| [{rule.code}](#{rule.code.lower()}) | `{rule.name}` |" in result.stdout


def test_docs_rules_md_is_generated_from_the_registry() -> None:
    assert DOCS_RULES.exists(), f"docs/rules.md is missing: run `{REGENERATE}`"
    assert DOCS_RULES.read_text(encoding="utf-8") == catalogue_markdown(), (
        f"docs/rules.md is out of date with the rule registry: run `{REGENERATE}`"
    )


# --- findings in the reports --------------------------------------------------------------------


def _report_with_findings(runs) -> dict:
    report = analyze_path(runs.write({0: runs.simple_rank(), 1: runs.simple_rank()}))
    report["findings"] = [
        {"rule": "PP001", "pattern": 3, "severity": "high",
         "title": "pipeline bubble 58% (theory 60%: p=4, m=2 < 4p)", "ranks": [],
         "evidence": {}, "advice": "16+ micro-batches, or interleaved 1F1B"},
        {"rule": "BAL001", "pattern": 3, "severity": "medium", "title": "straggler",
         "ranks": [1], "evidence": {}, "advice": ""},
        {"rule": "PIT001", "pattern": None, "severity": "low", "title": "same epoch order",
         "ranks": [0, 1, 2, 3, 6], "evidence": {}, "advice": "call sampler.set_epoch(epoch)"},
    ]  # fmt: skip
    return report


def test_text_report_renders_findings_like_the_design(runs) -> None:
    lines = render_text(_report_with_findings(runs)).splitlines()
    assert lines[1:6] == [
        "HIGH  pipeline bubble 58% (theory 60%: p=4, m=2 < 4p)  "
        "[PP001, pattern 3: speedup below theory]",
        "      advice: 16+ micro-batches, or interleaved 1F1B",
        "MED   straggler  rank 1  [BAL001, pattern 3: speedup below theory]",
        "LOW   same epoch order  ranks 0-3,6  [PIT001]",
        "      advice: call sampler.set_epoch(epoch)",
    ]


def test_markdown_and_html_render_findings_with_their_fix(runs) -> None:
    report = _report_with_findings(runs)
    markdown = render_markdown(report)
    (head,) = [line for line in markdown.splitlines() if line.startswith("- HIGH  pipeline")]
    assert head.endswith("  \\[PP001, pattern 3: speedup below theory]"), head  # no link opens
    assert "  - advice: 16+ micro-batches, or interleaved 1F1B" in markdown
    html = render_html(report)
    cards = html.split('<article class="card ')[1:]  # one card per finding, in order
    assert [card.split('"')[0] for card in cards] == ["high", "medium", "low"]
    assert "pipeline bubble 58%" in cards[0] and "16+ micro-batches" in cards[0]
    assert "straggler" in cards[1] and "BAL001" in cards[1]
