"""The screenshots of docs/img: the HTML report and the dashboard's Overview of a straggler run, a
healthy run and a failed run, at 1400 and 800 px, in headless Chromium.

    python benchmarks/screenshots.py [--out docs/img] [--runs DIR] [--height-max 2600]

The runs are made here (in --runs, a temporary folder by default; one already there is kept):
- `straggler`: `diag simulate --ranks 8 --steps 8 --inject straggler:rank=3,ms=40`;
- `healthy`: `diag simulate --ranks 8 --steps 8`;
- `failed`: the DP reference trainer on 2 gloo ranks (`diag run dp --nproc 2 --steps 400`) whose
  rank 1 is killed (SIGKILL) once both ranks have written a few steps: rank 1's records stop,
  and rank 0 is left in the step's all-reduce until torchrun ends it.
Each page is captured whole (up to --height-max px tall) and its PNG reduced to 256 colours with
`pngquant` when it is installed. Needs chromium and chromedriver (as
tests/browser/), and selenium.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DIAG = [sys.executable, "-m", "diag"]
WIDTHS = (1400, 800)
KILL_AFTER_STEPS = 4
"""The failed run: rank 1 is killed once rank 0 has written this many step records' bytes."""


def make_runs(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    runs = {name: folder / name for name in ("straggler", "healthy", "failed")}
    simulate = [*DIAG, "simulate", "--ranks", "8", "--steps", "8"]
    if not runs["straggler"].is_dir():
        inject = ["--inject", "straggler:rank=3,ms=40"]
        subprocess.run([*simulate, *inject, "--out", str(runs["straggler"])], check=True)
    if not runs["healthy"].is_dir():
        subprocess.run([*simulate, "--out", str(runs["healthy"])], check=True)
    if not runs["failed"].is_dir():
        failed_run(runs["failed"])
    return runs


def failed_run(out: Path, timeout_s: float = 300) -> None:
    """A DP run on 2 gloo ranks whose rank 1 dies (SIGKILL) mid-run."""
    job = subprocess.Popen(
        [*DIAG, "run", "dp", "--nproc", "2", "--steps", "400", "--out", str(out)],
        start_new_session=True,  # its own process group: ended as one if it outlives us
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    try:
        victim = None
        while victim is None:
            assert time.monotonic() < deadline, "the failed run never started its ranks"
            time.sleep(1.0)
            if _steps_written(out) >= KILL_AFTER_STEPS:
                victim = _rank_process(job.pid, rank=1)
        os.kill(victim, signal.SIGKILL)
        job.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def _steps_written(run: Path) -> int:
    """Steps rank 0 has finished, as `diag` reads the run so far (0 before it can)."""
    try:
        import diag

        steps = diag.load_any(run).steps
        return int(steps[steps["rank"] == 0]["step"].nunique()) if not steps.empty else 0
    except Exception:  # the files are being written: not readable yet
        return 0


def _rank_process(root: int, rank: int) -> int | None:
    """The process id of training rank `rank` among `root`'s descendants (its RANK variable)."""
    children = {root}
    for _ in range(4):  # diag -> torchrun -> its agent -> the ranks
        for pid in _all_pids():
            if _parent(pid) in children:
                children.add(pid)
    for pid in sorted(children - {root}):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"LOCAL_RANK=" + str(rank).encode() in environ:
            return pid
    return None


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def html_reports(runs: dict[str, Path], folder: Path) -> dict[str, Path]:
    out = {}
    for name, run in runs.items():
        out[name] = folder / f"{name}.html"
        subprocess.run([*DIAG, "analyze", str(run), "--format", "html", "--out", str(out[name])],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    return out


@contextmanager
def serving(run: Path) -> Iterator[str]:
    from werkzeug.serving import make_server

    from dashboard.app import create_app

    server = make_server("127.0.0.1", 0, create_app([run]).server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        thread.join(timeout=10)


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--hide-scrollbars", "--window-size=1400,1000"):  # fmt: skip
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


READY_JS = """
const report = document.body.dataset.chartsDrawn;
const dash = document.querySelector('#page .page');
const plots = document.querySelectorAll('.js-plotly-plot');
const drawn = document.querySelectorAll('.js-plotly-plot .main-svg');
const loading = document.querySelector('[data-dash-is-loading="true"]');
if (report !== undefined) return report !== '';
return Boolean(dash) && !loading && drawn.length >= plots.length && plots.length > 0;
"""


def capture(driver: Any, url: str, width: int, out: Path, height_max: int) -> None:
    """The page at `width` px, whole up to `height_max` px, as a PNG at `out`."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": 900, "deviceScaleFactor": 1,
                            "mobile": False})  # fmt: skip
    driver.get(url)
    deadline = time.monotonic() + 60
    while not driver.execute_script(READY_JS):
        assert time.monotonic() < deadline, f"{url} did not render"
        time.sleep(0.2)
    time.sleep(1.0)  # plotly's responsive relayout after the resize
    height = min(height_max, int(driver.execute_script("return document.body.scrollHeight")))
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1,
                            "mobile": False})  # fmt: skip
    time.sleep(1.0)
    driver.save_screenshot(str(out))
    if shutil.which("pngquant"):  # 256 colours: a fraction of the size, the text as sharp
        subprocess.run(["pngquant", "--force", "--skip-if-larger", "--strip", "--output",
                        str(out), "256", "--", str(out)], check=False)  # fmt: skip
    print(f"{out}  {out.stat().st_size / 1024:.0f} KiB")


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--runs", type=Path, default=None)
    parser.add_argument("--height-max", type=int, default=2600)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        runs = make_runs(args.runs or Path(scratch) / "runs")
        reports = html_reports(runs, Path(scratch))
        args.out.mkdir(parents=True, exist_ok=True)
        driver = browser()
        try:
            for name, run in runs.items():
                for width in WIDTHS:
                    capture(driver, reports[name].as_uri(), width,
                            args.out / f"report-{name}-{width}.png", args.height_max)  # fmt: skip
                with serving(run) as url:
                    for width in WIDTHS:
                        capture(driver, url, width, args.out / f"overview-{name}-{width}.png",
                                args.height_max)  # fmt: skip
        finally:
            driver.quit()


if __name__ == "__main__":
    main()
