"""The HTML report as a designed page: the run's status (and, for a job that did not finish, where
each rank stopped) at the top, the verdict as one card per finding coloured by severity (the
severity also in words), the headline as labelled facts, then the evidence charts, the tables and
the notes. Every string from the report is escaped here; `render_html` (report.py) calls `page`.

Each block is one function of the report dict, so a new block (a failure table, a section of
notes) is one more function in `page`'s list.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any, Protocol

from diag.outputs.html_charts import CHART_CSS, Chart, chart_markup, loader_markup
from diag.outputs.verdict import (
    Verdict,
    attribution_words,
    did_not_finish,
    failure_rows,
    run_status,
    status_words,
    summary_items,
    verdicts,
)

esc = html.escape


class Table(Protocol):
    """What a table of the page needs (report.Section)."""

    title: str
    header: list[str]
    rows: list[list[str]]


# Severity colours: the card's edge and tint, and its label's background (white text on it).
# The label says the severity in words too, so the colour is never the only sign.
PAGE_CSS = (
    ":root{--high:#b3261e;--high-bg:#fdecea;--medium:#8a5300;--medium-bg:#fff3df;"
    "--low:#3b5b7a;--low-bg:#eef3f8;--ok:#1e6b35;--ok-bg:#e8f5ec}"
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;"
    "padding:1.2em 1.5em 3em;max-width:1240px;color:#1d232a;line-height:1.4}"
    "h1{font-size:1.5em;margin:.2em 0 .4em;overflow-wrap:anywhere}"
    "h2{font-size:1.2em;margin:1.6em 0 .5em;border-bottom:1px solid #e3e6ea;padding-bottom:.2em}"
    ".top{display:flex;flex-wrap:wrap;align-items:center;gap:.4em 1em}"
    ".status{font-weight:600;padding:.15em .6em;border-radius:1em;background:#eef0f2}"
    ".status.failed{background:var(--high);color:#fff}"
    ".alert{border:2px solid var(--high);background:var(--high-bg);padding:.6em 1em;"
    "border-radius:6px;margin:.8em 0}"
    ".cards{display:flex;flex-direction:column;gap:.7em}"
    ".card{border-left:6px solid var(--low);background:var(--low-bg);border-radius:4px;"
    "padding:.6em 1em}"
    ".card.high{border-color:var(--high);background:var(--high-bg)}"
    ".card.medium{border-color:var(--medium);background:var(--medium-bg)}"
    ".card.ok{border-color:var(--ok);background:var(--ok-bg)}"
    ".sev{display:inline-block;font-weight:700;font-size:.8em;letter-spacing:.04em;color:#fff;"
    "background:var(--low);border-radius:3px;padding:.05em .45em;margin-right:.5em;"
    "vertical-align:.1em}"
    ".high .sev{background:var(--high)}.medium .sev{background:var(--medium)}"
    ".ok .sev{background:var(--ok)}"
    ".what{font-weight:600;font-size:1.05em}"
    ".card dl{display:grid;grid-template-columns:max-content 1fr;gap:.15em .8em;margin:.4em 0}"
    ".card dt{color:#555}.card dd{margin:0}"
    ".who.blamed{font-weight:600;color:var(--high)}"
    ".catalogue{font-size:.82em;color:#666}"
    ".facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(15em,1fr));gap:.6em}"
    ".fact{border:1px solid #e3e6ea;border-radius:6px;padding:.4em .7em}"
    ".fact .label{font-size:.82em;color:#555}.fact .value{font-weight:600}"
    ".chart-note{color:#333;max-width:60em}"
    ".scroll{overflow-x:auto}"
    "table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.92em}"
    "th,td{border:1px solid #d6d9dd;padding:.2em .6em;text-align:right}"
    "th{background:#f2f4f6}td:first-child,th:first-child{text-align:left}"
    "code{font-size:1em}"
)


def page(
    report: dict[str, Any],
    tables: Sequence[Table],
    charts: Sequence[Chart] = (),
    plotly_js_gzip: bytes | None = None,
) -> str:
    """The whole page. With `charts` and plotly.js (gzip-compressed) the charts follow the facts
    and plotly.js is inlined once (html_charts.py); without them the page has no script."""
    title = esc(f"diag report: {report['run'].get('run_id') or ''}")
    drawn = bool(charts) and plotly_js_gzip is not None
    parts = [
        "<!doctype html>",
        f'<html lang="en"><head><meta charset="utf-8"><title>{title}</title>',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<style>{PAGE_CSS}{CHART_CSS if drawn else ''}</style></head><body>",
        top(report, title),
        *failure(report),
        *verdict_cards(report),
        *facts(report),
    ]
    if drawn:
        notes = {"where the step goes": attribution_words(report.get("attribution"))}
        parts += chart_markup(charts, notes)
    parts += table_markup(tables)
    parts += skipped(report)
    if drawn and plotly_js_gzip is not None:
        parts.append(loader_markup(plotly_js_gzip))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def top(report: dict[str, Any], title: str) -> str:
    """The title and the run's status (the slot a job that did not finish fills in red)."""
    status = run_status(report)
    failed = " failed" if did_not_finish(report) else ""
    return (
        f'<header class="top"><h1>{title}</h1>'
        f'<span class="status{failed}" id="run-status">status: {esc(status)}</span></header>'
    )


def failure(report: dict[str, Any]) -> list[str]:
    """For a job that did not finish: an alert, and where each rank stopped when the report
    says (`verdict.failure_rows`); nothing for a job that did."""
    header, rows = failure_rows(report)
    if not did_not_finish(report) and not rows:
        return []
    parts = [
        '<div class="alert" id="failure"><strong>The job did not finish</strong> '
        f"({esc(status_words(report))}): the findings below it are of the steps before it "
        "stopped.</div>"
    ]
    if rows:
        parts.append(_table("where each rank stopped", header, rows))
    return parts


def verdict_cards(report: dict[str, Any]) -> list[str]:
    """The findings as cards, the main one first; a healthy run gets one card saying so."""
    found = verdicts(report)
    if not found:
        healthy = (
            '<article class="card ok" data-severity="none"><span class="sev">OK</span>'
            '<span class="what">No finding: nothing in this run crosses a rule\'s threshold'
            "</span></article>"
        )
        return ["<h2>Findings</h2>", f'<div class="cards">{healthy}</div>']
    return ["<h2>Findings</h2>", '<div class="cards">' + "".join(map(card, found)) + "</div>"]


def card(v: Verdict) -> str:
    rows = [("who", v.who, "who blamed" if v.singled_out else "who"), ("cost", v.cost, "cost"),
            ("why", v.why, "why"), ("fix", v.fix, "fix")]  # fmt: skip
    facts = "".join(
        f'<dt>{name}</dt><dd class="{cls}">{esc(text)}</dd>' for name, text, cls in rows if text
    )
    return (
        f'<article class="card {esc(v.severity)}" data-severity="{esc(v.severity)}">'
        f'<div><span class="sev">{esc(v.severity_text)}</span>'
        f'<span class="what">{esc(v.what)}</span></div><dl>{facts}</dl>'
        f'<div class="catalogue" title="the rule and the collapse pattern of the catalogue '
        f'(docs/rules.md)">{esc(v.catalogue)}</div></article>'
    )


def facts(report: dict[str, Any]) -> list[str]:
    """The headline as labelled facts, and the step time's line of text."""
    items = "".join(
        f'<div class="fact"><div class="label">{esc(label)}</div>'
        f'<div class="value">{esc(value)}</div></div>'
        for label, value in summary_items(report)
    )
    line = (report.get("summary") or {}).get("step_time_line")
    trend = f"<p><code>{esc(line)}</code></p>" if line else ""
    return ["<h2>The run</h2>", f'<div class="facts" id="facts">{items}</div>{trend}']


def table_markup(tables: Sequence[Table]) -> list[str]:
    return [_table(t.title, t.header, t.rows) for t in tables]


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f'<h2>{esc(title)}</h2><div class="scroll"><table><tr>{head}</tr>{body}</table></div>'


def skipped(report: dict[str, Any]) -> list[str]:
    notes = report.get("skipped") or []
    if not notes:
        return []
    items = "".join(f"<li>{esc(str(note))}</li>" for note in notes)
    return [f"<h2>Skipped</h2><ul>{items}</ul>"]
