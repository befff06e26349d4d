"""Memory bounds of a large trace folder's analysis (issue 43, docs/scale.md "Bounds").

    python benchmarks/trace_bounds.py client FOLDER [--tree TREE]   # the Dask client's load
    python benchmarks/trace_bounds.py killed FOLDER [--tree TREE] [--spilled 4]
    python benchmarks/trace_bounds.py parse TRACE [--tree TREE]     # one worker's parse

`client`: `load_trace_dir(FOLDER, breakdown=reduce_rank_files)` (no cache) by a client process
of a fresh 2-worker `LocalCluster` (one thread, 6 GiB each): the client's RSS after its
imports, its peak (VmHWM) during the load and after it, each worker's peak.
`killed`: `diag analyze FOLDER` SIGKILLed once `--spilled` traces are in its spill folder, in a
temporary directory of its own: what stays there, and which of its workers still run 5 s
later (ended then, by their PID).
`parse`: one trace parsed, packed and spilled as a worker does (`kineto._parse_chunk`'s
steps), in this process: RSS over the imports after each step and the peak so far.
`--tree`: the diag source tree imported (another commit's, exported), in every process.
FOLDER is big enough to be reduced (>= 128 MiB of JSON): e.g. `python benchmarks/big_traces.py
/tmp/big --ranks 16 --layout dp=4,pp=4 --steps 1000 --plain`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from benchmarks.processes import children
except ModuleNotFoundError:  # run as a script: benchmarks/ itself is on sys.path
    from processes import children  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
CLIENT = r"""
import sys, time
from diag.metrics.file_reduction import reduce_rank_files
from diag.read.kineto import load_trace_dir
from diag.read.parallel import using_scheduler
def status(key):
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith(key)).split()[1]) // 1024
imports = status("VmRSS")
t = time.monotonic()
with using_scheduler(sys.argv[2]):
    run = load_trace_dir(sys.argv[1], use_cache=False, breakdown=reduce_rank_files)
print(imports, status("VmHWM"), status("VmRSS"), round(time.monotonic() - t, 1))
"""
PARSE = r"""
import sys
from pathlib import Path
import diag.read.kineto as kineto
from diag.read.kineto import files, spill
from diag.read.kineto.kernels import KernelPatterns
def status(key):
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith(key)).split()[1]) // 1024
path, out = Path(sys.argv[1]), Path(sys.argv[2])
base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) from here
seen = {}
def mark(name):
    seen[name] = (status("VmRSS") - base, status("VmHWM") - base)
real_scanned = files._scanned
def scanned(*args):
    found = real_scanned(*args)
    mark("scan")
    return found
files._scanned = scanned
trace = files.parse_file(path, KernelPatterns())
mark("records")
trace, spans, comms = kineto._packed(trace)
mark("packed")
spill.write(out, trace.records.get("step", []), spans, comms)
out.unlink()
mark("spilled")
print(base, path.stat().st_size // 2**20, *(f"{k}:{r}:{p}" for k, (r, p) in seen.items()))
"""


def _peak_kib() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def client(folder: Path, tree: Path) -> dict[str, object]:
    from distributed import Client, LocalCluster

    # the scheduler (in this process) reads the tasks, the workers run them: both import TREE
    sys.path.insert(0, str(tree))
    os.environ["PYTHONPATH"] = str(tree)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                     dashboard_address=None, memory_limit="6GiB") as cluster,
        Client(cluster) as watcher,
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", CLIENT, str(folder), cluster.scheduler_address],
            env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
        )  # fmt: skip
        workers = watcher.run(_peak_kib)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    imports, peak, after, wall = done.stdout.split()
    return {
        "client_imports_MiB": int(imports), "client_load_peak_MiB": int(peak),
        "client_after_MiB": int(after), "load_s": float(wall),
        "workers_peak_MiB": sorted(kib // 1024 for kib in workers.values()),
    }  # fmt: skip


def killed(folder: Path, tree: Path, spilled: int) -> dict[str, object]:
    temp = Path(tempfile.mkdtemp(prefix="trace-bounds-"))
    env = {**os.environ, "PYTHONPATH": str(tree), "TMPDIR": str(temp),
           "XDG_CACHE_HOME": str(temp / "cache")}  # fmt: skip
    started = time.monotonic()
    diag = Path(sys.executable).parent / "diag"
    child = subprocess.Popen([str(diag), "analyze", str(folder), "--format", "json", "--out",
                              str(temp / "report.json")], env=env)  # fmt: skip
    while True:
        found = list(temp.glob("diag-spill-*"))
        if found and len(list(found[0].glob("*.npz"))) >= spilled:
            break
        if child.poll() is not None:
            raise SystemExit("the analysis ended before spilling")
        time.sleep(0.2)
    workers = children(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    after = time.monotonic() - started
    time.sleep(5)
    alive = {}
    for pid in workers:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if "State:\tZ" not in status:
            rss = next(line for line in status.splitlines() if line.startswith("VmRSS"))
            alive[pid] = int(rss.split()[1]) // 1024
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    left = found[0]
    return {
        "killed_after_s": round(after, 1), "left": left.name,
        "left_MiB": round(sum(f.stat().st_size for f in left.iterdir()) / 2**20, 1),
        "workers_alive_5s_later_MiB": alive, "temp": str(temp),
    }  # fmt: skip


def parse(trace: Path, tree: Path) -> dict[str, object]:
    out = Path(tempfile.mkdtemp(prefix="trace-bounds-")) / "0.npz"
    done = subprocess.run([sys.executable, "-c", PARSE, str(trace), str(out)],
                          env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                          text=True)  # fmt: skip
    out.parent.rmdir()
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    imports, size, *stages = done.stdout.split()
    steps = {name: {"rss_MiB": int(rss), "peak_MiB": int(peak)}
             for name, rss, peak in (stage.split(":") for stage in stages)}  # fmt: skip
    return {"imports_MiB": int(imports), "trace_MiB": int(size), "over_imports": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["client", "killed", "parse"])
    parser.add_argument("path", type=Path)
    parser.add_argument("--tree", type=Path, default=REPO)
    parser.add_argument("--spilled", type=int, default=4)
    options = parser.parse_args()
    path, tree = options.path.resolve(), options.tree.resolve()
    if options.what == "client":
        found = client(path, tree)
    elif options.what == "killed":
        found = killed(path, tree, options.spilled)
    else:
        found = parse(path, tree)
    print(json.dumps({"tree": str(tree), **found, "load_average": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
