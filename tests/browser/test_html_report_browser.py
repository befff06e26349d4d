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

from diag.cli.main import main
from tests.browser.conftest import HOSTILE
from tests.browser.test_dashboard_browser import RENDER_TIMEOUT_S, _console_errors, label_overlaps

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
def reports(reference_runs: list[Path], tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("html-reports")
    return [_report(run, folder / f"{run.name}.html") for run in reference_runs[:3]]


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
    assert {"Findings", "where the step goes", "time per rank", "communication", "memory"} <= (
        sections
    )
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
