"""The cost of one collector flush: a DP step's records encoded as one Arrow record batch (the
`.arrows` rank file) and as JSON lines (`.jsonl`), the writers' `_encode` without the write. Arrow
twice: as the collectors encode it (diag/rankfile/arrow_encode.py, the message assembled from its
buffers) and through pyarrow's conversion of Python objects (arrow_format.encode_batch, the same
bytes; what the collectors did before).

    python benchmarks/flush_cost.py [--repeat 300] [--records dp|pp]

`dp`: one DP step as reference_runs/dp.py records it (spans data/fwd/bwd/opt, the gradient
all-reduce with its `seq`, the step, the memory sample: 7 records); `pp`: 4 micro-batches of
fwd/bwd with a send and a recv each (20 records). Prints the thread's CPU time a flush, the
best of 15 rounds, in ms.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from diag.rankfile import arrow_encode, arrow_format

T = 1_700_000_000_000_000_000


def dp_step(step: int) -> list[dict[str, Any]]:
    t = T + step * 100_000_000
    spans = [
        {"kind": "span", "step": step, "mb": 0, "phase": phase, "stage": 0, "chunk": 0,
         "t0": t + i * 10_000_000, "t1": t + (i + 1) * 10_000_000}
        for i, phase in enumerate(("data", "fwd", "bwd", "opt"))
    ]  # fmt: skip
    comm = {"kind": "comm", "step": step, "op": "all_reduce", "group": "dp", "group_size": 2,
            "bytes": 3_800_000, "dtype": "float32", "t0": t + 25_000_000, "t1": t + 29_000_000,
            "expected_bytes": 3_800_000, "tag": "grads", "async": True,
            "blocking": False, "seq": step + 1}  # fmt: skip
    record = {"kind": "step", "step": step, "t0": t, "t1": t + 40_000_000, "tokens": 256,
              "loss": 6.25}  # fmt: skip
    mem = {"kind": "mem", "step": step, "params": 4194304, "grads": 4194304,
           "optimizer": 8388608, "activations": None, "comm_buffers": 1048576,
           "fragmentation": None, "device_peak": None, "host_rss": 104857600,
           "source": "tensors"}  # fmt: skip
    return [*spans, comm, record, mem]


def pp_step(step: int) -> list[dict[str, Any]]:
    t = T + step * 100_000_000
    out: list[dict[str, Any]] = []
    for mb in range(4):
        for phase, op in (("fwd", "send"), ("bwd", "recv")):
            t0 = t + len(out) * 1_000_000
            out.append({"kind": "span", "step": step, "mb": mb, "phase": phase, "stage": 1,
                        "chunk": 0, "t0": t0, "t1": t0 + 900_000})  # fmt: skip
            out.append({"kind": "comm", "step": step, "op": op, "group": "pp",
                        "group_size": 2, "bytes": 65536, "dtype": "float32", "t0": t0 + 900_000,
                        "t1": t0 + 950_000, "expected_bytes": 65536, "tag": "activations",
                        "async": False, "blocking": True, "mb": mb, "peer": 0,
                        "seq": 8 * step + len(out) // 2 + 1})  # fmt: skip
    return [*out, *dp_step(step)[3:]]


def as_json(records: list[dict[str, Any]]) -> bytes:
    """What collectors/writer.py's RankWriter writes a flush."""
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()


Encoder = Callable[[list[dict[str, Any]]], bytes]


def per_flush_ms(encoders: dict[str, Encoder], steps: list[list[dict[str, Any]]],
                 repeat: int, rounds: int = 15) -> dict[str, float]:  # fmt: skip
    """The CPU time of this thread a flush, in ms, the best of `rounds` rounds of `repeat`
    flushes each, the encoders interleaved (on a shared machine the best round is the one
    least disturbed; wall time there measures the neighbours)."""
    best = dict.fromkeys(encoders, float("inf"))
    for _ in range(rounds):
        for name, encode in encoders.items():
            start = time.thread_time()
            for i in range(repeat):
                encode(steps[i % len(steps)])
            best[name] = min(best[name], (time.thread_time() - start) / repeat * 1e3)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeat", type=int, default=300, help="flushes a round")
    p.add_argument("--records", choices=("dp", "pp"), default="dp")
    args = p.parse_args()
    make = dp_step if args.records == "dp" else pp_step
    steps = [make(s) for s in range(64)]
    ms = per_flush_ms({"arrow": arrow_encode.encode_flush, "converted": arrow_format.encode_batch,
                       "jsonl": as_json}, steps, args.repeat)  # fmt: skip
    print(f"{len(steps[0])} records a flush: arrow {ms['arrow']:.4f} ms (pyarrow's conversion "
          f"{ms['converted']:.4f} ms), jsonl {ms['jsonl']:.4f} ms; arrow / jsonl "
          f"{ms['arrow'] / ms['jsonl']:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
