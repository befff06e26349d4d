"""A run of many ranks in a real browser: the Ranks and Timeline pages group its 256 ranks by
host, show a group x step heatmap, and draw one host's ranks at a time; clicking a group's bar or
picking a group in the selector draws that group's ranks instead."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.browser.test_dashboard_browser import RENDER_TIMEOUT_S, _console_errors, label_overlaps

pytestmark = pytest.mark.browser

DRAWN_JS = """
const plots = document.querySelectorAll('#page .js-plotly-plot');
if (plots.length < arguments[0]) return false;
for (const plot of plots) { if (!plot.querySelector('.main-svg')) return false; }
return !document.querySelector('.dash-graph--pending, [data-dash-is-loading="true"]');
"""
"""Whether Dash is done and plotly drew `arguments[0]` graphs at least (asked in one script:
no element goes stale between two questions while Dash swaps components)."""


def _wait_rendered(driver: Any, min_graphs: int) -> None:
    """Until the page is drawn on two polls 0.1 s apart."""
    streak = 0
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    while streak < 2:
        assert time.monotonic() < deadline, f"{driver.current_url} did not render"
        streak = streak + 1 if driver.execute_script(DRAWN_JS, min_graphs) else 0
        time.sleep(0.1)


def _texts(driver: Any, selector: str) -> list[str]:
    """The text of every element `selector` finds, read in one script."""
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]), e => e.textContent);",
            selector,
        )
    )


def _table_ranks(driver: Any) -> list[int]:
    return sorted(int(t) for t in _texts(driver, "#ranks-table tbody tr td:first-child"))


def _timeline_rows(driver: Any) -> set[str]:
    return set(_texts(driver, "#timeline-graph .ytick text"))


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _heatmap_drawn(driver: Any, graph_id: str) -> bool:
    from selenium.webdriver.common.by import By

    return bool(driver.find_elements(By.CSS_SELECTOR, f"#{graph_id} .hm image"))


def test_ranks_page_shows_hosts_and_drills_into_one(browser: Any, large_dashboard_url: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    browser.get(large_dashboard_url + "/ranks")
    _wait_rendered(browser, 4)
    assert _heatmap_drawn(browser, "ranks-heatmap")
    hosts = _texts(browser, "#ranks-heatmap .ytick text")
    assert "node0 !" in hosts and len(hosts) <= 32  # 32 hosts (labels thinned), not 256 ranks
    # the drill-down starts at the straggler's host: its 8 ranks, one bar each
    assert _table_ranks(browser) == list(range(8))
    assert "rank 1 !" in _texts(browser, "#ranks-breakdown .xtick text")
    # a click on node5's bar draws node5's ranks
    bars = browser.find_elements(By.CSS_SELECTOR, "#ranks-groups .bars .point")
    assert len(bars) == 32
    ActionChains(browser).move_to_element(bars[5]).click().perform()
    _until(lambda: _table_ranks(browser) == list(range(40, 48)), "node5's ranks not shown")
    _wait_rendered(browser, 4)
    assert _texts(browser, "#ranks-breakdown .xtick text")[0] == "rank 40"
    assert "node5" in browser.find_element(By.CSS_SELECTOR, "#ranks-group").text
    # grouped by blocks of 32 ranks instead: 8 rows, and the straggler's block drawn
    _choose(browser, "ranks-group-by", "blocks of 32 ranks")
    _until(lambda: _table_ranks(browser) == list(range(32)), "the block of rank 1 not shown")
    _wait_rendered(browser, 4)
    assert "ranks 0-31 !" in _texts(browser, "#ranks-heatmap .ytick text")
    assert not _console_errors(browser)


def _choose(driver: Any, dropdown_id: str, label: str) -> None:
    """Pick the option starting with `label` in the dropdown `dropdown_id`."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f"#{dropdown_id}").click()
    options = driver.find_elements(By.XPATH, f"//*[@role='option'][starts-with(., '{label}')]")
    assert options, f"no {label} in #{dropdown_id}"
    options[0].click()


def test_timeline_draws_one_host_at_a_time(browser: Any, large_dashboard_url: str) -> None:
    browser.get(large_dashboard_url + "/timeline")
    _wait_rendered(browser, 2)
    assert _heatmap_drawn(browser, "timeline-groups")
    assert _timeline_rows(browser) == {"rank 1 !"} | {f"rank {r}" for r in (0, *range(2, 8))}
    _choose(browser, "timeline-group", "node3 (8 ranks)")
    expected = {f"rank {r}" for r in range(24, 32)}
    _until(lambda: _timeline_rows(browser) == expected, "node3's ranks not drawn")
    _wait_rendered(browser, 2)
    assert not _console_errors(browser)


def test_memory_page_shows_hosts(browser: Any, large_dashboard_url: str) -> None:
    browser.get(large_dashboard_url + "/memory")
    _wait_rendered(browser, 4)
    assert _heatmap_drawn(browser, "memory-heatmap")
    assert len(_texts(browser, "#memory-ranks .xtick text")) == 8  # one host's ranks
    # grouped by blocks of 32 ranks instead: the heatmap's rows are the 8 blocks
    _choose(browser, "memory-group-by", "blocks of 32 ranks")

    def block_rows() -> list[str]:
        return [t.rstrip(" !") for t in _texts(browser, "#memory-heatmap .ytick text")]

    _until(lambda: "ranks 0-31" in block_rows(), "the memory page did not regroup by blocks")
    _wait_rendered(browser, 4)
    assert not any(row.startswith("node") for row in block_rows())
    assert not _console_errors(browser)


def test_no_labels_overlap_on_any_page_of_a_large_run(
    browser: Any, large_dashboard_url: str
) -> None:
    for path, graphs in (("/", 2), ("/ranks", 4), ("/timeline", 2), ("/communication", 2),
                         ("/memory", 4)):  # fmt: skip
        browser.get(large_dashboard_url + path)
        _wait_rendered(browser, graphs)
        drawn, overlaps = label_overlaps(browser, "#page .js-plotly-plot")
        assert drawn >= graphs and overlaps == [], (path, overlaps)
    assert not _console_errors(browser)
