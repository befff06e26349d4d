"""Browser tests: the dashboard served on 127.0.0.1 over real reference runs, driven by headless
Chromium through chromedriver (Debian's `chromium` and `chromium-driver`; `.ci/run` installs
them). Without them the tests skip here and fail under CI (CI=true)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.serving import make_server

from benchmarks.synthetic_run import write_synthetic_run
from dashboard.app import create_app
from dashboard.data import LoadedRun, load_runs
from tests.conftest import copy_with_names
from tests.distributed.conftest import diag_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _need_browser() -> None:
    if CHROMIUM and CHROMEDRIVER:
        return
    message = (
        "headless Chromium and chromedriver are needed (apt-get install chromium chromium-driver)"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


REAL_TRACE = Path(__file__).parents[3] / "shared" / "real-traces" / "hta-sampled-world128"
"""Two ranks of a real 128-GPU NCCL job's profiler traces (served when ../shared is there)."""
HOSTILE = 'hostile <img src=x id=injected onerror="document.title=1"><b>bold</b>'
"""A run id and host name that would run script and change markup if rendered as HTML."""


@pytest.fixture(scope="session")
def reference_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Real gloo runs: DP with a straggler on rank 1, EP with a hot expert, and a copy of the DP
    run whose manifest names its run and hosts in HTML."""
    root = tmp_path_factory.mktemp("browser-runs")
    dp, ep, hostile = root / "dp-straggler", root / "ep-skew", root / "hostile"
    diag_run(dp, "--steps", "4", "--inject", "straggler:rank=1,ms=150")
    diag_run(ep, "--steps", "4", "--inject", "skew:frac=0.8", trainer="ep")
    copy_with_names(dp, hostile, HOSTILE)
    return [dp, ep, hostile, *([REAL_TRACE] if REAL_TRACE.is_dir() else [])]


LARGE_RANKS = 256
"""The synthetic run of the large-run tests: 256 ranks on 32 hosts of 8, rank 1 a straggler."""


@pytest.fixture(scope="session")
def large_dashboard_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dashboard over a synthetic 256-rank x 4-step DP run (benchmarks/synthetic_run.py),
    where it groups the ranks."""
    _need_browser()
    run = tmp_path_factory.mktemp("browser-large") / "dp256"
    write_synthetic_run(run, ranks=LARGE_RANKS, steps=4, microbatches=1)
    with _serving(create_app([run])) as url:
        yield url


JOB_WIDE = "dp-job-wide"
"""The DP straggler run with one more finding that names every rank (a host finding, as a
machine with fewer cores than ranks gets): the pages must still blame rank 1 only."""
HOST_FINDING = {
    "rule": "HST001", "pattern": 3, "severity": "low",
    "title": "host vm: ranks wait for a core 48% of the step (2 ranks on 1 core)",
    "ranks": [0, 1], "evidence": {}, "advice": "run fewer ranks per host", "margin": None,
    "explains": [], "cost_s": 0.05, "cost_share": 0.2,
}  # fmt: skip


@pytest.fixture(scope="session")
def job_wide_run(reference_runs: list[Path]) -> LoadedRun:
    """`JOB_WIDE`: the straggler run as loaded, its report given `HOST_FINDING` after its own."""
    (loaded,) = load_runs([reference_runs[0]])
    report = {**loaded.report, "findings": [*loaded.report["findings"], HOST_FINDING]}
    return dataclasses.replace(loaded, name=JOB_WIDE, report=report)


@pytest.fixture(scope="session")
def dashboard_url(reference_runs: list[Path], job_wide_run: LoadedRun) -> Iterator[str]:
    _need_browser()
    with _serving(create_app([*reference_runs, job_wide_run])) as url:
        yield url


@contextlib.contextmanager
def _serving(app: Any) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1000"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
