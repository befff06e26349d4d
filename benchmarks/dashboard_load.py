"""Dashboard render time: how long each page takes to show a large run in a real browser.

    python benchmarks/dashboard_load.py [--ranks 64] [--steps 200] [--experts 8] [--repeats 5]
        [--run DIR] [--pages /ranks /timeline] [--goal SECONDS]

Writes a synthetic run (benchmarks/synthetic_run.py: 64 ranks x 200 steps with MoE experts, so
every page has data) into a temporary directory, loads it the way the dashboard does
(`dashboard.data.load_runs`: load, metrics, rules, report; timed as the server-side load), and
serves `dashboard.app.create_app` on 127.0.0.1 (a free port, `app.run` in a daemon thread).
Headless Chromium (selenium, /usr/bin/chromium and /usr/bin/chromedriver) then opens every page
and measures the seconds from `driver.get(url)` until the page is completely rendered, polled
every 10 ms (30 s timeout):
- something to show: a plotly graph (`.js-plotly-plot`), a `.no-data` note, or, on a page of
  text only (the overview), the router's output in `#page`;
- every `.js-plotly-plot` holds its `.main-svg` and no graph is `.dash-graph--pending` (plotly
  still loading or drawing);
- no element is `[data-dash-is-loading="true"]` (no callback in flight);
- all of the above on two polls in a row, so a callback about to start is not missed.

The first load of the app (empty browser cache, bundles fetched) is reported apart as "cold";
then every page is loaded `--repeats` times, round after round. Per page it prints the median,
min and max seconds, the spread (max / min), the goal (median <= 2 s up to 64 ranks, <= 3 s
above; `--goal` sets it) and whether the median meets it, the median's ratio to the server-side
load time, and the payload: the bytes of the Dash callback responses (`_dash-update-component`,
uncompressed JSON: the page's layout and figures) of one load, the median over the loads.
Exit status 1 when a page never finished rendering.

`--run DIR` serves an existing run directory instead of writing one (`--ranks`, `--steps`
and `--experts` are then ignored); `--pages` measures some pages only.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from flask import Response, request
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service

from dashboard.app import create_app
from dashboard.data import LoadedRun, load_runs

try:
    from benchmarks.synthetic_run import write_synthetic_run
except ModuleNotFoundError:  # run as a script: benchmarks/ itself is on sys.path
    from synthetic_run import write_synthetic_run  # type: ignore[no-redef]

PAGES = ("/", "/timeline", "/ranks", "/communication", "/memory", "/experts", "/compare")
GOAL_SECONDS = 2.0
LARGE_GOAL_SECONDS = 3.0
"""The goal above LARGE_RANKS ranks (the dashboard groups ranks there)."""
LARGE_RANKS = 64
POLL_SECONDS = 0.010
RENDER_TIMEOUT_SECONDS = 30.0
SERVER_START_TIMEOUT_SECONDS = 30.0
STABLE_POLLS = 2
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROME_ARGUMENTS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000")

RENDER_STATE_JS = """
const plots = document.querySelectorAll('.js-plotly-plot');
const page = document.getElementById('page');
const textPage = page !== null && page.childElementCount > 0;
if (plots.length === 0 && !document.querySelector('.no-data') && !textPage) {
    return 'nothing shown yet';
}
for (const plot of plots) {
    if (!plot.querySelector('.main-svg')) return 'a graph without its .main-svg';
}
if (document.querySelector('.dash-graph--pending')) return 'a graph pending';
if (document.querySelector('[data-dash-is-loading="true"]')) return 'a callback loading';
return 'rendered';
"""
"""The page's state: 'rendered' when complete, otherwise what it still waits for."""


@dataclass
class PageTimes:
    path: str
    seconds: list[float]
    failure: str | None = None  # why a load never finished rendering
    payload_bytes: list[int] = field(default_factory=list)  # callback responses of each load

    @property
    def median_seconds(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    @property
    def median_payload(self) -> int | None:
        return int(statistics.median(self.payload_bytes)) if self.payload_bytes else None


class Payload:
    """Bytes of the Dash callback responses the server sent since the last `take()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = 0

    def add(self, count: int) -> None:
        with self._lock:
            self._bytes += count

    def take(self) -> int:
        with self._lock:
            count, self._bytes = self._bytes, 0
        return count


class RenderTimeout(Exception):
    """A page did not finish rendering in time; the message says what it waited for."""


# --- The server ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(runs: list[LoadedRun], port: int, payload: Payload) -> threading.Thread:
    """Serve the dashboard in a daemon thread (it ends with the process), counting the bytes of
    its callback responses into `payload`; returns when the server answers."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    logging.getLogger("dash.dash").setLevel(logging.WARNING)  # no "Dash is running on"
    app = create_app(runs)

    @app.server.after_request
    def count_payload(response: Response) -> Response:
        if request.path.endswith("_dash-update-component") and not response.direct_passthrough:
            payload.add(len(response.get_data()))
        return response

    thread = threading.Thread(
        target=app.run,
        kwargs={"host": "127.0.0.1", "port": port, "debug": False},
        name="dashboard-server",
        daemon=True,
    )
    thread.start()
    wait_for_server(f"http://127.0.0.1:{port}/", thread)
    return thread


def wait_for_server(url: str, thread: threading.Thread) -> None:
    deadline_s = time.monotonic() + SERVER_START_TIMEOUT_SECONDS
    while time.monotonic() < deadline_s:
        if not thread.is_alive():
            raise RuntimeError("the dashboard server thread ended before it answered")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the dashboard did not answer at {url} in {SERVER_START_TIMEOUT_SECONDS} s")


# --- The browser --------------------------------------------------------------------------------


def start_browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in CHROME_ARGUMENTS:
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(RENDER_TIMEOUT_SECONDS)
    return driver


def render_seconds(driver: webdriver.Chrome, url: str) -> float:
    """Seconds from `driver.get(url)` until the page is completely rendered (see the module
    docstring); raises RenderTimeout naming what it still waited for."""
    started_s = time.perf_counter()
    driver.get(url)
    deadline_s = started_s + RENDER_TIMEOUT_SECONDS
    stable = 0
    state = "not polled"
    while time.perf_counter() < deadline_s:
        state = driver.execute_script(RENDER_STATE_JS)
        if state == "rendered":
            stable += 1
            if stable >= STABLE_POLLS:
                return time.perf_counter() - started_s
        else:
            stable = 0
        time.sleep(POLL_SECONDS)
    raise RenderTimeout(f"{url}: not rendered after {RENDER_TIMEOUT_SECONDS:.0f} s ({state})")


class Browser:
    """The headless browser, started again after a page hangs it."""

    def __init__(self) -> None:
        self.driver = start_browser()

    def restart(self) -> None:
        with contextlib.suppress(Exception):  # a wedged browser may not even quit
            self.driver.quit()
        self.driver = start_browser()


def load_once(browser: Browser, url: str, times: PageTimes, payload: Payload) -> None:
    """One timed load of `url` into `times`; a page that does not render in time, or hangs the
    browser (its driver stops answering), is a failure, and the browser starts afresh."""
    payload.take()
    try:
        times.seconds.append(render_seconds(browser.driver, url))
    except RenderTimeout as err:
        times.failure = str(err)
    except (WebDriverException, OSError, urllib3.exceptions.HTTPError) as err:
        times.failure = f"{url}: the browser hung ({type(err).__name__})"
        browser.restart()
    else:
        times.payload_bytes.append(payload.take())


def measure_pages(
    browser: Browser,
    base_url: str,
    repeats: int,
    progress: Callable[[str], None],
    payload: Payload,
    pages: tuple[str, ...] = PAGES,
) -> list[PageTimes]:
    """Every page `repeats` times, round after round (noise hits every page alike). A page that
    failed once is not loaded again."""
    results = {path: PageTimes(path, []) for path in pages}
    for round_index in range(repeats):
        for path, times in results.items():
            if times.failure is None:
                load_once(browser, base_url + path, times, payload)
        done = ", ".join(
            f"{t.path} {'FAILED' if t.failure else f'{t.seconds[-1]:.2f} s'}"
            for t in results.values()
            if t.seconds or t.failure
        )
        progress(f"round {round_index + 1}/{repeats} done: {done}")
    return list(results.values())


# --- Report -------------------------------------------------------------------------------------


def report_lines(
    load_seconds: float, cold: PageTimes, pages: list[PageTimes], goal: float = GOAL_SECONDS
) -> list[str]:
    header = (
        f"{'page':<16}{'median s':>10}{'min s':>8}{'max s':>8}{'spread':>8}"
        f"{'goal':>8}  {'meets':<6}{'render/load':>12}{'payload KiB':>13}"
    )
    lines = [
        f"server-side load (dashboard.data.load_runs: load, metrics, rules, report): "
        f"{load_seconds:.2f} s",
        f"cold first load of {cold.path}: "
        + (f"{cold.seconds[0]:.2f} s" if cold.seconds else f"FAILED {cold.failure}"),
        "",
        header,
    ]
    for times in pages:
        if not times.seconds:
            lines.append(f"{times.path:<16}FAILED {times.failure}")
            continue
        median_s, min_s, max_s = times.median_seconds or 0.0, min(times.seconds), max(times.seconds)
        payload = times.median_payload
        lines.append(
            f"{times.path:<16}{median_s:>10.3f}{min_s:>8.3f}{max_s:>8.3f}"
            f"{max_s / min_s:>7.2f}x{f'<= {goal:g}':>8}  "
            f"{'yes' if median_s <= goal else 'NO':<6}{median_s / load_seconds:>12.3f}"
            f"{'n/a' if payload is None else f'{payload / 1024:.1f}':>13}"
        )
        if times.failure:
            lines.append(f"{'':<16}then FAILED {times.failure}")
    met = sum(1 for t in pages if t.median_seconds is not None and t.median_seconds <= goal)
    lines += ["", f"{met} of {len(pages)} pages meet the goal (median <= {goal:g} s)"]
    return lines


# --- Main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5, help="loads of every page after the cold one")
    p.add_argument("--run", type=Path, help="serve this run directory instead of a new one")
    p.add_argument("--pages", nargs="+", choices=PAGES, default=list(PAGES), metavar="PATH")
    p.add_argument(
        "--goal", type=float,
        help=f"seconds a page's median may take (default {GOAL_SECONDS:g}, "
        f"{LARGE_GOAL_SECONDS:g} above {LARGE_RANKS} ranks)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if min(args.ranks, args.steps, args.repeats) < 1:
        p.error("--ranks, --steps and --repeats must be >= 1")
    return args


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started_s = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started_s


def run_benchmark(args: argparse.Namespace, work_dir: Path) -> tuple[list[str], bool]:
    if args.run is not None:
        run_dir = args.run
    else:
        run_dir, write_s = timed(
            lambda: write_synthetic_run(
                work_dir / "synthetic", args.ranks, args.steps, experts=args.experts
            )
        )
        progress(f"wrote the synthetic run in {write_s:.1f} s")
    runs, load_s = timed(lambda: load_runs([run_dir]))
    progress(f"loaded the run in {load_s:.1f} s")
    manifest = runs[0].run.manifest
    goal = args.goal
    if goal is None:
        goal = LARGE_GOAL_SECONDS if manifest.world_size > LARGE_RANKS else GOAL_SECONDS
    port = free_port()
    payload = Payload()
    start_server(runs, port, payload)
    base_url = f"http://127.0.0.1:{port}"
    progress(f"dashboard serving at {base_url}")
    browser = Browser()
    try:
        cold = PageTimes(args.pages[0], [])
        load_once(browser, base_url + args.pages[0], cold, payload)
        pages = measure_pages(browser, base_url, args.repeats, progress, payload, tuple(args.pages))
    finally:
        browser.driver.quit()
    shape = f"run {run_dir}" if args.run is not None else f"synthetic, experts={args.experts}"
    title = (
        f"dashboard render times: {manifest.world_size} ranks x {manifest.steps_completed} steps "
        f"({shape}), {args.repeats} loads per page after one cold load"
    )
    failed = cold.failure is not None or any(t.failure for t in pages)
    return [title, *report_lines(load_s, cold, pages, goal)], failed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_s = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dashboard-load-") as work_dir:
        lines, failed = run_benchmark(args, Path(work_dir))
    print("\n".join(lines))
    print(f"(benchmark took {time.perf_counter() - started_s:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
