"""The HTML report (`diag analyze RUN --format html`) in real headless Chromium with the network
off: every figure of the page is drawn by the plotly.js the page carries, no request leaves the
page, nothing is logged as an error, names from a hostile manifest stay text, the step time over
the steps is drawn with the straggler's own line, and no two text labels of a chart overlap.

The runs are the browser tests' real gloo runs (tests/browser/conftest.py: DP with a straggler,
EP with a hot expert, the DP run named in HTML); the 1,024-rank report's size and grouping are
tests/unit/test_html_report.py's, its grouped figures the dashboard's (test_dashboard_large)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dashboard.data import LoadedRun
from dashboard.html_report import plotly_js_gzip, report_charts
from diag.cli.main import main
from diag.outputs.html_charts import Chart
from diag.outputs.report import render_html
from tests.browser.conftest import HOSTILE, JOB_WIDE
from tests.browser.test_dashboard_browser import (
    MARKED_JS,
    RENDER_TIMEOUT_S,
    SEVERITY_WORDS,
    _console_errors,
    label_overlaps,
    severity_shown,
)

pytestmark = pytest.mark.browser

DRAWN_JS = """
const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
return {
  state: document.body.dataset.chartsDrawn || null,
  figures: document.querySelectorAll('script.diag-figure').length,
  drawn: plots.map(p => p.querySelectorAll('.main-svg g.trace path, .main-svg .hm image')
                        .length),
  requests: performance.getEntriesByType('resource').map(e => e.name),
  sections: Array.from(document.querySelectorAll('h2'), h => h.textContent),
};
"""
"""What the page drew: the loader's state, the figures it holds, per plotly graph the marks drawn
(bar and line paths, heatmap images), the resources it fetched, and its section headings."""


def _report(run: Path, out: Path) -> Path:
    result = CliRunner().invoke(main, ["analyze", str(run), "--format", "html", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def reports(
    reference_runs: list[Path], job_wide_run: LoadedRun, tmp_path_factory: pytest.TempPathFactory
) -> list[Path]:
    """The reports of the DP straggler, the EP run, the hostile copy, and `JOB_WIDE` (the
    straggler run's report with a finding naming every rank, rendered as `analyze` does)."""
    folder = tmp_path_factory.mktemp("html-reports")
    made = [_report(run, folder / f"{run.name}.html") for run in reference_runs[:3]]
    loaded = job_wide_run
    charts = [Chart(s, f) for s, f in report_charts(loaded.run, loaded.metrics, loaded.report)]
    job_wide = folder / f"{JOB_WIDE}.html"
    job_wide.write_text(render_html(loaded.report, charts, plotly_js_gzip()), encoding="utf-8")
    return [*made, job_wide]


def _open_offline(driver: Any, page: Path) -> dict[str, Any]:
    """Load `page` from disk with the network emulated offline, and wait for its charts; the
    network is back on afterwards (the session's browser serves the dashboard tests too)."""
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions", _network(offline=True))
    try:
        driver.get_log("browser")  # drop what earlier pages logged
        driver.get(page.resolve().as_uri())
        deadline = time.monotonic() + RENDER_TIMEOUT_S
        while True:
            seen = driver.execute_script(DRAWN_JS)
            if seen["state"] is not None:
                return dict(seen)
            assert time.monotonic() < deadline, f"{page.name}: charts not drawn"
            time.sleep(0.1)
    finally:
        driver.execute_cdp_cmd("Network.emulateNetworkConditions", _network(offline=False))


def _network(offline: bool) -> dict[str, Any]:
    return {"offline": offline, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}


@pytest.mark.parametrize("which", [0, 1, 2], ids=["dp-straggler", "ep-skew", "hostile"])
def test_every_figure_draws_offline(browser: Any, reports: list[Path], which: int) -> None:
    seen = _open_offline(browser, reports[which])
    assert seen["state"] == str(seen["figures"]), seen["state"]  # "error" if plotly failed
    assert seen["figures"] >= 6
    assert len(seen["drawn"]) == seen["figures"]
    assert all(marks > 0 for marks in seen["drawn"]), seen["drawn"]
    assert seen["requests"] == []
    assert _console_errors(browser) == []
    sections = set(seen["sections"])
    assert {"Findings", "The run", "where the step goes", "time per rank", "communication",
            "memory"} <= sections  # fmt: skip
    assert any(s.startswith("timeline of step") for s in sections)
    if which == 1:
        assert "expert load" in sections


STEP_TIME_JS = """
const heading = Array.from(document.querySelectorAll('h2'))
  .find((h) => h.textContent === 'step time over steps');
const chart = heading ? heading.nextElementSibling : null;
return chart ? {
  id: chart.id,
  lines: chart.querySelectorAll('.scatterlayer .trace').length,
  legend: Array.from(chart.querySelectorAll('.legendtext'), (t) => t.textContent),
} : null;
"""
"""The chart under the heading "step time over steps": its id, line traces and legend entries."""


@pytest.mark.parametrize("which", [0, 1, 2], ids=["dp-straggler", "ep-skew", "hostile"])
def test_the_step_time_is_drawn_and_no_labels_overlap(
    browser: Any, reports: list[Path], which: int
) -> None:
    seen = _open_offline(browser, reports[which])
    assert seen["state"] == str(seen["figures"]), seen["state"]
    chart = browser.execute_script(STEP_TIME_JS)
    assert chart is not None, seen["sections"]
    assert chart["lines"] >= 3, chart  # the median and each of the two ranks
    assert "median over ranks" in chart["legend"], chart
    if which != 1:  # the DP runs: rank 1 is the straggler, its line named
        assert "rank 1 !" in chart["legend"], chart
    graphs, overlaps = label_overlaps(browser, ".js-plotly-plot")
    assert graphs == seen["figures"]
    assert overlaps == [], overlaps


def test_names_from_the_manifest_stay_text(browser: Any, reports: list[Path]) -> None:
    _open_offline(browser, reports[2])
    assert browser.find_elements("id", "injected") == []
    assert browser.title == "diag report: " + HOSTILE
    heading = browser.find_element("tag name", "h1").text
    assert heading == "diag report: " + HOSTILE


def test_every_finding_card_says_its_severity_in_words(browser: Any, reports: list[Path]) -> None:
    from selenium.webdriver.common.by import By

    seen = 0
    for page in reports:
        _open_offline(browser, page)
        cards = browser.find_elements(By.CSS_SELECTOR, ".cards .card")
        assert cards, page.name
        for severity, word in severity_shown(cards):
            assert word == SEVERITY_WORDS[severity], (page.name, severity, word)
            seen += 1
        # the cards come before the run's facts, and those before the charts
        order = [h.text for h in browser.find_elements(By.TAG_NAME, "h2")]
        assert (
            order.index("Findings") < order.index("The run") < order.index("where the step goes")
        ), order
    assert seen >= 6


def test_only_the_ranks_a_finding_singles_out_are_marked(browser: Any, reports: list[Path]) -> None:
    from selenium.webdriver.common.by import By

    _open_offline(browser, reports[3])
    assert browser.execute_script(MARKED_JS.replace("#page ", "")) == [1]  # not 0
    assert {b.text for b in browser.find_elements(By.CSS_SELECTOR, ".who.blamed")} == {"rank 1"}
    whole = [w.text for w in browser.find_elements(By.CSS_SELECTOR, ".who")]
    assert "ranks 0-1 (every rank: the whole job)" in whole


RANK_COLOURS_JS = """
const heading = Array.from(document.querySelectorAll('h2'))
  .find((h) => h.textContent === 'step time over steps');
const colours = {};
for (const trace of heading.nextElementSibling.querySelectorAll('.scatterlayer .trace')) {
  const data = trace.__data__ && trace.__data__[0] && trace.__data__[0].trace;
  const line = trace.querySelector('.js-line');
  const found = data && String(data.name).match(/^rank (\\d+)/);
  if (found && line) colours[found[1]] = getComputedStyle(line).stroke;
}
return colours;
"""
"""Rank -> the colour its line is drawn in, in the step time chart of a report."""


def test_a_rank_has_the_same_colour_in_two_reports(browser: Any, reports: list[Path]) -> None:
    _open_offline(browser, reports[0])  # rank 1 blamed
    first = browser.execute_script(RANK_COLOURS_JS)
    _open_offline(browser, reports[1])  # another job, another blame
    second = browser.execute_script(RANK_COLOURS_JS)
    assert set(first) == set(second) == {"0", "1"}, (first, second)
    assert first == second
    assert first["0"] != first["1"]


def test_no_labels_overlap_at_800_px(browser: Any, reports: list[Path]) -> None:
    browser.set_window_size(800, 1000)
    try:
        seen = _open_offline(browser, reports[0])
        time.sleep(0.5)  # plotly's responsive relayout
        graphs, overlaps = label_overlaps(browser, ".js-plotly-plot")
        assert graphs == seen["figures"] and overlaps == [], overlaps
    finally:
        browser.set_window_size(1400, 1000)
