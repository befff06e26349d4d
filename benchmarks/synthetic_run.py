"""A synthetic run directory (`diag.run/1`): a data-parallel job of many ranks with one straggler,
written in seconds, for benchmarks of the analysis and the dashboard at a size no test machine
can train.

    python benchmarks/synthetic_run.py OUT [--ranks 64] [--steps 200] [--experts 8]
        [--microbatches 4] [--straggler-rank 1 | --straggler-rank none] [--seed 0]

What the ranks do per step, as the DP reference trainer and its recording DDP hook would record
it (docs/run-format.md):
- `microbatches` x spans `data`, `fwd`, `bwd` (gradient accumulation, `mb` = the index),
- one DDP bucket (the model's gradients fit in `bucket_mb`): an async `all_reduce` on group `dp`
  launched when the last backward ends, `bytes` == `expected_bytes` == params x 4 (float32),
  and the hook's `comm_wait` span from that launch to the all-reduce's completion,
- `opt`, then the `mem` record (six categories, fragmentation and device_peak null on CPU,
  activations measured on the first 3 steps and every 10th as the collectors do) and the `step`
  record (tokens, loss),
- with `experts` > 0, one `experts` record per MoE layer (2 layers) with the tokens routed to
  each expert, the dropped assignments, the per-call capacity and the aux loss.

Times are an alpha-beta model of a small GPT on CPU ranks (about 100 ms a step), with a few per
cent of seeded jitter per span. The straggler's forward and backward take 1.5x as long; the
all-reduce completes only once it joins, so every other rank waits for it in `comm_wait`.
With `experts` > 0 every rank holds every expert (layout ep = 1, like the ep trainer with
`--ep 1`: plain data parallelism), so each rank writes the expert load of its own tokens.
Output is deterministic for given arguments and seed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

# Run as a script, or imported as a top-level module with benchmarks/ on sys.path: the
# repository root makes its sibling modules importable as benchmarks.*.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.synthetic_manifest import build_manifest
from benchmarks.synthetic_model import RunShape
from benchmarks.synthetic_records import rank_records, rank_text
from benchmarks.synthetic_simulate import simulate_expert_load, simulate_losses, simulate_timeline
from diag.contract.schema import MANIFEST_FILE, RANK_FILE_RE, rank_file_name, write_manifest

HOST_RSS_NOISE_BYTES = 2_000_000


def write_synthetic_run(
    out: Path,
    ranks: int = 64,
    steps: int = 200,
    *,
    microbatches: int = 4,
    experts: int = 0,
    straggler_rank: int | None = 1,
    seed: int = 0,
) -> Path:
    """Write a complete run directory at `out` (created; rank files of an earlier run there are
    removed) and return `out`. Raises ValueError on impossible arguments."""
    shape = RunShape(ranks, steps, microbatches, experts, straggler_rank, seed)
    _check(shape)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _remove_old_run(out)
    rng = np.random.default_rng(seed)
    timeline = simulate_timeline(shape, rng)
    losses = simulate_losses(shape, rng)
    load = simulate_expert_load(shape, rng) if experts > 0 else None
    rss_noise_bytes = rng.normal(0.0, HOST_RSS_NOISE_BYTES, (steps, ranks))
    for rank in range(ranks):
        records = rank_records(shape, rank, timeline, losses, load, rss_noise_bytes, rng)
        (out / rank_file_name(rank)).write_text(rank_text(records), encoding="utf-8")
    write_manifest(out, build_manifest(out, shape))
    return out


def _check(shape: RunShape) -> None:
    if shape.ranks < 1 or shape.steps < 1 or shape.microbatches < 1:
        raise ValueError(
            f"ranks, steps and microbatches must be >= 1, got {shape.ranks}, {shape.steps}, "
            f"{shape.microbatches}"
        )
    if shape.experts < 0 or shape.experts == 1:
        raise ValueError(f"experts must be 0 (a dense model) or >= 2, got {shape.experts}")
    if shape.straggler_rank is not None and not 0 <= shape.straggler_rank < shape.ranks:
        raise ValueError(f"straggler rank {shape.straggler_rank} is not in 0..{shape.ranks - 1}")


def _remove_old_run(out: Path) -> None:
    for path in out.iterdir():
        if RANK_FILE_RE.match(path.name) or path.name == MANIFEST_FILE:
            path.unlink()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out", type=Path, help="run directory to write (created)")
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--experts", type=int, default=0, help="experts per MoE layer (0: dense)")
    p.add_argument(
        "--straggler-rank", default="1", help="the rank that computes 1.5x longer, or 'none'"
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        args.straggler_rank = None if args.straggler_rank == "none" else int(args.straggler_rank)
    except ValueError:
        p.error(f"--straggler-rank must be a rank or 'none', got {args.straggler_rank!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_s = time.perf_counter()
    try:
        out = write_synthetic_run(
            args.out, args.ranks, args.steps, microbatches=args.microbatches,
            experts=args.experts, straggler_rank=args.straggler_rank, seed=args.seed,
        )  # fmt: skip
    except ValueError as err:
        print(f"synthetic_run: error: {err}", file=sys.stderr)
        return 2
    elapsed_s = time.perf_counter() - started_s
    size_bytes = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(
        f"wrote {out}: {args.ranks} ranks x {args.steps} steps, {size_bytes / 2**20:.1f} MiB "
        f"in {elapsed_s:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
