"""The charts of the HTML report as page markup: plotly figures as inert JSON, plotly.js once.

A report is attached to tickets and pull requests and opened offline, so the page carries its own
plotly.js. The bundle is 4.8 MB as text; it travels gzip-compressed and base64-encoded (about
1.9 MB) and the browser inflates it with `DecompressionStream` (Chromium 80, Firefox 113,
Safari 16.4) before drawing the figures, which keeps a 1,024-rank report under 5 MB.

Nothing here knows plotly: figures arrive as JSON text (`dashboard/html_report.py` builds them
with the dashboard's own figure functions), so `diag` stays free of the dashboard. Names in the
figures come from run directories and traces, which are hostile input: the JSON goes into
`<script type="application/json">` elements, which the browser never runs, with `<`, `>` and `&`
escaped so no text can close the element; the page's own script reads them with `JSON.parse`.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Chart:
    """One figure of the report: the heading of its part of the page and plotly's JSON of it
    (`go.Figure.to_json()`)."""

    section: str
    figure_json: str


def inert_json(text: str) -> str:
    """JSON text that cannot end a `<script>` element or open a comment: `<`, `>` and `&` as
    `\\u003c`, `\\u003e`, `\\u0026` (the same value to `JSON.parse`; outside strings JSON
    never holds these characters)."""
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


# The page's one script: inflate plotly.js, run it, then draw every figure in page order. When
# the browser cannot (no DecompressionStream), the figures' places say so; the tables stay.
_LOADER = """
(async () => {
  const figures = document.querySelectorAll("script.diag-figure");
  const CONFIG = {displaylogo: false, responsive: true, showLink: false, showSendToCloud: false};
  try {
    const packed = document.getElementById("diag-plotly-gz").textContent.trim();
    const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
    const inflated = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    const library = document.createElement("script");
    library.textContent = await new Response(inflated).text();
    document.head.appendChild(library);
    for (const holder of figures) {
      const figure = JSON.parse(holder.textContent);
      const target = document.getElementById(holder.dataset.target);
      await Plotly.newPlot(target, figure.data, figure.layout, CONFIG);
    }
    document.body.dataset.chartsDrawn = String(figures.length);
  } catch (error) {
    for (const holder of figures) {
      document.getElementById(holder.dataset.target).textContent =
        "chart not drawn: " + error;
    }
    document.body.dataset.chartsDrawn = "error";
  }
})();
"""

CHART_CSS = ".chart{width:100%;max-width:1200px;min-height:320px;margin:.5em 0 1.5em}"


def chart_markup(charts: Sequence[Chart], notes: Mapping[str, str] | None = None) -> list[str]:
    """The page body's chart parts, in order: a heading where the section changes, then per
    chart an empty `div` and the inert JSON that the loader draws into it; after a section's
    charts, its note from `notes` (by section) as a paragraph."""
    parts: list[str] = []
    section = None
    for index, chart in enumerate(charts):
        if chart.section != section:
            parts += _note(section, notes)
            section = chart.section
            parts.append(f"<h2>{html.escape(section)}</h2>")
        target = f"diag-chart-{index}"
        parts.append(f'<div class="chart" id="{target}"></div>')
        parts.append(
            f'<script type="application/json" class="diag-figure" data-target="{target}">'
            f"{inert_json(chart.figure_json)}</script>"
        )
    return parts + _note(section, notes)


def _note(section: str | None, notes: Mapping[str, str] | None) -> list[str]:
    text = (notes or {}).get(section or "")
    return [f'<p class="chart-note">{html.escape(text)}</p>'] if text else []


def loader_markup(plotly_js_gzip: bytes) -> str:
    """plotly.js (gzip-compressed bytes) as base64 in an inert element, and the loader."""
    packed = base64.b64encode(plotly_js_gzip).decode("ascii")
    return (
        f'<script type="application/octet-stream" id="diag-plotly-gz">{packed}</script>\n'
        f'<script type="text/javascript">{_LOADER}</script>'
    )
