"""Peak memory of reading hostile inputs whose size is the point: how many copies of what is read
a reader holds (issue 42, "Copies of what is read").

    PYTHONPATH=. python benchmarks/read_copies.py [MiB]          # every case, 256 MiB by default

Each case is generated under a temporary folder, then read in a fresh process (one reader call:
a rank file through `read_rank_file`, a trace through `parse_file`); the line printed is the
case, the input's size, the peak resident memory above the process before the read (VmHWM
minus VmRSS after imports) and the ratio of the two, with the first words of the outcome.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

_READER = r"""
import sys
from pathlib import Path

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

kind, path = sys.argv[1], Path(sys.argv[2])
from diag.rankfile.rank_file import read_rank_file
from diag.read.kineto.files import parse_file
from diag.read.kineto.kernels import KernelPatterns
import diag.read.kineto.events  # noqa: F401  (msgspec's decoders built before the baseline)
base = status("VmRSS")
if kind == "rank":
    part = read_rank_file(1, path)
    outcome = (part.skipped or ["read"])[0]
else:
    parsed = parse_file(path, KernelPatterns())
    outcome = parsed.error or f"read ({len(parsed.records.get('span', []))} spans)"
print(status("VmHWM") - base, outcome[:110].replace("\n", " "))
"""


def _rank_file_one_line(path: Path, size: int) -> None:
    """One JSON line of `size` bytes (a record with a huge field), then a valid step."""
    with open(path, "wb") as fh:
        fh.write(b'{"kind": "event", "step": 0, "name": "x", "blob": "')
        fh.write(b"a" * size)
        fh.write(b'"}\n{"kind": "step", "step": 0, "t0": 1, "t1": 2}\n')


def _rank_file_many_lines(path: Path, size: int) -> None:
    """Ordinary span records, `size` bytes of them."""
    line = b'{"kind": "span", "step": 0, "mb": 0, "phase": "fwd", "t0": 1, "t1": 2}\n'
    with open(path, "wb") as fh:
        fh.write(line * (size // len(line)))


def _trace_one_event(size: int) -> bytes:
    head = b'{"distributedInfo": {"rank": 1}, "traceEvents": [{"name": "'
    return head + b"ab" * (size // 2) + b'", "ph": "X", "ts": 0, "dur": 1}]}'


def _trace_compressible(path: Path, size: int) -> None:
    """A trace of one huge event, gzip within 100 times (about 85x: a varied text)."""
    text = b"".join(b"kernel_%07d " % (i % 9_000_000) for i in range(size // 13))
    data = b'{"traceEvents": [{"name": "' + text + b'", "ph": "X", "ts": 0, "dur": 1}]}'
    path.write_bytes(gzip.compress(data, compresslevel=6))


def main(mib: int) -> None:
    size = mib * 2**20
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = {
            "rank file, one line": ("rank", folder / "rank-00001.jsonl", _rank_file_one_line),
            "rank file, short lines": ("rank", folder / "r" / "rank-00001.jsonl",
                                       _rank_file_many_lines),
            "trace, one event": ("trace", folder / "rank1.pt.trace.json",
                                 lambda p, n: p.write_bytes(_trace_one_event(n))),
            "trace.gz, one event": ("trace", folder / "rank1.pt.trace.json.gz",
                                    _trace_compressible),
        }  # fmt: skip
        for name, (kind, path, make) in cases.items():
            path.parent.mkdir(exist_ok=True)
            make(path, size)
            done = subprocess.run([sys.executable, "-c", _READER, kind, str(path)],
                                  capture_output=True, text=True, check=False)  # fmt: skip
            if done.returncode != 0:
                print(f"{name}: failed: {done.stderr.strip().splitlines()[-1]}")
                continue
            peak, _, outcome = done.stdout.strip().partition(" ")
            on_disk = path.stat().st_size
            print(f"{name:24} {on_disk / 2**20:8.1f} MiB on disk  peak +{int(peak) / 2**20:7.0f} "
                  f"MiB  ({int(peak) / size:.2f}x the text)  {outcome}")  # fmt: skip
            path.unlink()
    json.dumps({})


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
