"""Every page of the dashboard in a real browser over real runs: the figures render (plotly drew
its SVG), pages without data say so, the console holds no error, strings from manifests stay
text, and no two text labels of a chart overlap (LABEL_OVERLAPS_JS, the HTML report's test uses
it too). Screenshots go to the test's folder, or to $DIAG_SCREENSHOTS when set (docs/img uses it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from dashboard.app import PAGES
from tests.browser.conftest import HOSTILE, JOB_WIDE, REAL_TRACE

pytestmark = pytest.mark.browser

RENDER_TIMEOUT_S = 60
# (path, run in the selector, graphs at least, text that must show)
EXPECTED = [
    ("/", "dp-straggler", 1, "BAL001"),
    ("/timeline", "dp-straggler", 1, "first step"),
    ("/ranks", "dp-straggler", 2, "blamed by the findings: 1"),
    ("/communication", "dp-straggler", 3, "Communication"),
    ("/memory", "dp-straggler", 2, "Memory"),
    ("/experts", "dp-straggler", 0, "not an expert-parallel run"),
    ("/experts", "ep-skew", 3, "Experts"),
    ("/compare", "dp-straggler", 1, "dp-straggler"),
]

LABEL_OVERLAPS_JS = """
const LABELS = ['.gtitle', '.xtitle', '.ytitle', '.legendtext', '.annotation-text',
                '.xtick text', '.ytick text'];
return Array.from(document.querySelectorAll(arguments[0]), (plot) => {
  const boxes = [];
  for (const selector of LABELS) {
    for (const label of plot.querySelectorAll(selector)) {
      const box = label.getBoundingClientRect();
      const text = label.textContent.trim();
      if (text && box.width >= 1 && box.height >= 1) boxes.push({selector, text, box});
    }
  }
  const overlaps = [];
  boxes.forEach((a, i) => boxes.slice(i + 1).forEach((b) => {
    const across = Math.min(a.box.right, b.box.right) - Math.max(a.box.left, b.box.left);
    const down = Math.min(a.box.bottom, b.box.bottom) - Math.max(a.box.top, b.box.top);
    if (across > 1 && down > 1) {
      overlaps.push(`${a.selector} '${a.text}' / ${b.selector} '${b.text}'`);
    }
  }));
  const holder = plot.closest('[id]');
  return {graph: holder ? holder.id : '?', labels: boxes.length, overlaps};
});
"""
"""Per plotly graph under the CSS selector `arguments[0]`: the id of the element holding it, how
many text labels it has (titles, legend entries, annotations, tick labels) and each pair of them
whose boxes intersect by more than 1 px both ways."""


def label_overlaps(driver: Any, selector: str) -> tuple[int, list[str]]:
    """The plotly graphs under `selector` and their overlapping labels, as `graph: a / b`."""
    plots = driver.execute_script(LABEL_OVERLAPS_JS, selector)
    assert all(p["labels"] > 0 for p in plots), plots  # every graph has drawn its labels
    return len(plots), [f"{p['graph']}: {pair}" for p in plots for pair in p["overlaps"]]


def _rendered(driver: Any, min_graphs: int) -> bool:
    """Dash finished its callbacks and plotly drew every graph on the page, `min_graphs` at
    least (dcc.Graph loads its code lazily, so a graph can be missing for a moment)."""
    from selenium.webdriver.common.by import By

    if driver.find_elements(By.CSS_SELECTOR, "[data-dash-is-loading='true']"):
        return False
    page = driver.find_elements(By.CSS_SELECTOR, "#page .page, #page .no-data")
    plots = driver.find_elements(By.CSS_SELECTOR, "#page .js-plotly-plot")
    drawn = driver.find_elements(By.CSS_SELECTOR, "#page .js-plotly-plot .main-svg")
    return (
        bool(page)
        and all(p.find_elements(By.CSS_SELECTOR, ".main-svg") for p in plots)
        and (len(drawn) >= len(plots))
    )


def _wait_rendered(driver: Any, min_graphs: int = 0) -> None:
    """Until the page is rendered on two polls 0.1 s apart (Dash may still swap a component
    right after the first)."""
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    streak = 0
    while streak < 2:
        assert time.monotonic() < deadline, f"{driver.current_url} did not render"
        streak = streak + 1 if _rendered(driver, min_graphs) else 0
        time.sleep(0.1)


def _select_run(driver: Any, name: str, min_graphs: int = 0) -> None:
    from selenium.webdriver.common.by import By

    current = driver.find_element(By.CSS_SELECTOR, "#run-select").text
    if name in current:
        return
    driver.find_element(By.CSS_SELECTOR, "#run-select").click()
    deadline = time.monotonic() + 5  # the menu opens a moment after the click under load
    while not (
        options := driver.find_elements(By.XPATH, f"//*[@role='option'][contains(., '{name}')]")
    ):
        assert time.monotonic() < deadline, f"no run {name} in the selector"
        time.sleep(0.1)
    options[0].click()
    time.sleep(0.2)
    _wait_rendered(driver, min_graphs)


def _console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DIAG_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_every_page_renders_without_console_errors(
    browser: Any, dashboard_url: str, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    assert {p.PATH for p in PAGES} == {path for path, *_ in EXPECTED}
    shots = _shots(tmp_path)
    browser.get(dashboard_url + "/")
    _wait_rendered(browser)
    for path, run, min_graphs, text in EXPECTED:
        browser.get(dashboard_url + path)
        _wait_rendered(browser)
        _select_run(browser, run, min_graphs)
        _wait_rendered(browser, min_graphs)
        body = browser.find_element(By.TAG_NAME, "body").text
        assert text in body, (path, run, body[:500])
        drawn = browser.find_elements(By.CSS_SELECTOR, "#page .js-plotly-plot .main-svg")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#page .js-plotly-plot")) >= min_graphs
        assert (len(drawn) > 0) == (min_graphs > 0), (path, run)
        if min_graphs == 0:
            assert browser.find_elements(By.CSS_SELECTOR, ".no-data"), (path, run)
        name = "overview" if path == "/" else path.strip("/")
        browser.save_screenshot(str(shots / f"{name}-{run}.png"))
        if min_graphs:  # no two text labels of any chart of any page overlap, wide or narrow
            _, overlaps = label_overlaps(browser, "#page .js-plotly-plot")
            assert overlaps == [], (path, run, overlaps)
            assert _overlaps_at(browser, 800) == [], (path, run, "800 px")
        if path == "/":
            assert browser.find_elements(By.CSS_SELECTOR, "#overview-step-time .main-svg"), run
        assert not _console_errors(browser), (path, run, _console_errors(browser))


def test_the_first_finding_is_on_top_and_names_the_straggler(
    browser: Any, dashboard_url: str
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(dashboard_url + "/")
    _wait_rendered(browser)
    _select_run(browser, "dp-straggler")
    first = browser.find_elements(By.CSS_SELECTOR, ".finding")[0]
    assert "main" in first.get_attribute("class")
    assert "BAL001" in first.text
    assert first.find_element(By.CSS_SELECTOR, ".who.blamed").text == "rank 1"


def test_overview_draws_where_the_step_goes(browser: Any, dashboard_url: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(dashboard_url + "/")
    _wait_rendered(browser, 1)
    _select_run(browser, "dp-straggler", 1)
    _wait_rendered(browser, 1)
    chart = browser.find_element(By.CSS_SELECTOR, "#overview-waterfall")
    rows = [t.text for t in chart.find_elements(By.CSS_SELECTOR, ".ytick text")]
    # top to bottom: the measured step, the ideal step, the straggler and at least one more cause
    assert rows[-2:] == ["ideal step", "measured step (replayed)"], rows  # ticks bottom first
    assert len(rows) >= 4 and any("rank 1" in t for t in rows), rows
    assert not any("overlap" in t for t in rows), rows  # said in words, not drawn
    assert "where the step goes" in chart.text
    note = browser.find_element(By.CSS_SELECTOR, "#page .chart-note").text
    assert note.startswith("The ideal step") and "measured alone" in note
    costs = browser.find_elements(By.CSS_SELECTOR, ".finding .cost")
    assert costs and "of the step (" in costs[0].text
    assert not _console_errors(browser)


def test_overview_draws_the_step_time_and_no_labels_overlap(
    browser: Any, dashboard_url: str
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(dashboard_url + "/")
    _wait_rendered(browser, 2)
    traces = [REAL_TRACE.name] if REAL_TRACE.is_dir() else []
    for run in ("dp-straggler", "ep-skew", "hostile", *traces):
        _select_run(browser, run, 2)
        _wait_rendered(browser, 2)
        chart = browser.find_element(By.CSS_SELECTOR, "#overview-step-time")
        assert "step time over the analysed steps" in chart.text, run
        legend = [t.text for t in chart.find_elements(By.CSS_SELECTOR, ".legendtext")]
        assert "median over ranks" in legend, (run, legend)
        assert len(chart.find_elements(By.CSS_SELECTOR, ".scatterlayer .trace")) >= 3, run
        if run == "dp-straggler":
            assert "rank 1 !" in legend, legend  # the straggler's own line, named
        graphs, overlaps = label_overlaps(browser, "#page .js-plotly-plot")
        # the real traces' layout is unknown (no process groups): no replay, so no waterfall
        assert graphs >= (1 if run in traces else 2), (run, graphs)
        assert overlaps == [], (run, overlaps)
    assert not _console_errors(browser)


def test_timeline_step_selector_redraws(browser: Any, dashboard_url: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(dashboard_url + "/timeline")
    _wait_rendered(browser)
    _select_run(browser, "dp-straggler", 1)
    bars_one = len(browser.find_elements(By.CSS_SELECTOR, "#timeline-graph .bars .point"))
    browser.find_element(By.XPATH, "//*[@id='timeline-window']//label[contains(., '2')]").click()
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    while len(browser.find_elements(By.CSS_SELECTOR, "#timeline-graph .bars .point")) <= bars_one:
        assert time.monotonic() < deadline, "two steps drew no more bars than one"
        time.sleep(0.05)
    assert not _console_errors(browser)


def test_names_from_manifests_render_as_text(browser: Any, dashboard_url: str) -> None:
    from selenium.webdriver.common.by import By

    for path in ("/", "/ranks", "/timeline"):
        browser.get(dashboard_url + path)
        _wait_rendered(browser)
        _select_run(browser, "hostile", 0 if path == "/" else 1)
        assert not browser.find_elements(By.CSS_SELECTOR, "#injected, #page b"), path
        assert browser.title == "diag dashboard", path
        body = browser.find_element(By.TAG_NAME, "body").text
        assert HOSTILE in body, (path, body[:300])  # shown as typed, markup and all
    assert not _console_errors(browser)


@pytest.mark.skipif(not REAL_TRACE.is_dir(), reason="../shared/real-traces is absent")
def test_a_profiler_trace_folder_is_served_like_a_run(browser: Any, dashboard_url: str) -> None:
    from selenium.webdriver.common.by import By

    for path, graphs in (("/", 0), ("/timeline", 1), ("/ranks", 2), ("/communication", 3)):
        browser.get(dashboard_url + path)
        _wait_rendered(browser)
        _select_run(browser, REAL_TRACE.name, graphs)
        _wait_rendered(browser, graphs)
        assert len(browser.find_elements(By.CSS_SELECTOR, "#page .js-plotly-plot")) >= graphs
    assert not _console_errors(browser)


SEVERITY_WORDS = {"high": "HIGH", "medium": "MEDIUM", "low": "LOW", "ok": "OK"}


def severity_shown(cards: list[Any]) -> list[tuple[str, str]]:
    """Per finding card: its severity class and the word its badge shows, checking the badge is
    drawn (visible, of some size) in a colour other than its background."""
    from selenium.webdriver.common.by import By

    shown = []
    for card in cards:
        (severity,) = set(card.get_attribute("class").split()) & set(SEVERITY_WORDS)
        badge = card.find_element(By.CSS_SELECTOR, ".sev")
        assert badge.is_displayed() and badge.size["width"] > 10, card.text
        assert badge.value_of_css_property("color") != badge.value_of_css_property(
            "background-color"
        )
        shown.append((severity, badge.text))
    return shown


def test_every_finding_card_says_its_severity_in_words(browser: Any, dashboard_url: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(dashboard_url + "/")
    _wait_rendered(browser)
    seen = 0
    for run in ("dp-straggler", "ep-skew", JOB_WIDE):
        _select_run(browser, run, 1)
        cards = browser.find_elements(By.CSS_SELECTOR, "#page .finding.card")
        assert cards, run
        for severity, word in severity_shown(cards):
            assert word == SEVERITY_WORDS[severity], (run, severity, word)
            seen += 1
    assert seen >= 4


MARKED_JS = """
const marked = new Set();
for (const text of document.querySelectorAll('#page .js-plotly-plot text')) {
  const found = text.textContent.match(/rank (\\d+) !/);
  if (found) marked.add(Number(found[1]));
}
return Array.from(marked).sort();
"""
"""The ranks that some chart of the page labels as blamed (`rank N !`)."""


def test_only_the_ranks_a_finding_singles_out_are_marked(browser: Any, dashboard_url: str) -> None:
    from selenium.webdriver.common.by import By

    for path, graphs in (("/", 2), ("/ranks", 2), ("/timeline", 1)):
        browser.get(dashboard_url + path)
        _wait_rendered(browser)
        _select_run(browser, JOB_WIDE, graphs)
        _wait_rendered(browser, graphs)
        assert browser.execute_script(MARKED_JS) == [1], path  # not 0: the host names both
        if path == "/":
            blamed = browser.find_elements(By.CSS_SELECTOR, ".who.blamed")
            assert {b.text for b in blamed} == {"rank 1"}
            whole = [w.text for w in browser.find_elements(By.CSS_SELECTOR, ".who")]
            assert "ranks 0-1 (every rank: the whole job)" in whole
        if path == "/ranks":
            note = browser.find_element(By.CSS_SELECTOR, "#page .blamed").text
            assert note == "blamed by the findings: 1"
    assert not _console_errors(browser)


def _overlaps_at(driver: Any, width: int) -> list[str]:
    """The page's overlapping chart labels once the window is `width` px wide (plotly redraws
    responsive graphs on the resize; no reload), the window back to 1400 px after."""
    driver.set_window_size(width, 1000)
    try:
        time.sleep(0.4)  # plotly's responsive relayout
        _wait_rendered(driver)
        return label_overlaps(driver, "#page .js-plotly-plot")[1]
    finally:
        driver.set_window_size(1400, 1000)
        time.sleep(0.2)
