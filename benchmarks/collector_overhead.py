"""Collector overhead on the DP reference loop: step time with collectors on over off, one run.

    python benchmarks/collector_overhead.py [--nproc 2] [--steps 100] [--block 4] [--warmup 5]
                                            [--format both|arrow|jsonl]

Launches itself under torchrun. Every rank builds three identical DDP-wrapped GPTs (same seed,
same data) and trains them in the loop shape of reference_runs/dp.py (spans data/fwd/bwd/opt,
step tokens, `loss.item()`):

    on     a `Recorder` with collective tracing, activation tracking, the recording DDP hook and
           its watchdog thread (collectors/watchdog.py: in-flight state, heartbeats every
           `--heartbeat-s`, stall checks twice a second at most)
    off    plain DDP (no hook) driven through a `NullRecorder` (collectors switched off)
    plain  plain DDP with no recorder calls at all

After a warm-up, they run in interleaved blocks of `--block` steps, in the order
on-off-plain, plain-off-on, ... so that machine noise (other processes, frequency changes) hits
every variant alike. A step's time is the slowest rank's (`perf_counter` around the whole
step). Rank 0 prints the medians and `collector overhead (on/off step time): X.XXX` (the goal is
<= 1.01), and `on/plain`, the collectors with their watchdog against the uninstrumented loop;
`off/plain` is the cost of the switched-off recorder's no-op contexts. With
`--format both` (the default) the whole measurement runs once per rank-file format (Arrow IPC
stream, JSON lines), one torchrun job each.

The launcher's own options (`--nproc`, `--format`) are not passed on to the ranks: torchrun
would read `--nproc` as an abbreviation of its ambiguous `--nproc-per-node`/`--nproc_per_node`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

_CHILD_ENV = "DIAG_OVERHEAD_BENCH_CHILD"
VARIANTS = ("on", "off", "plain")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nproc", type=int, default=2, help="ranks (processes) to launch")
    p.add_argument("--steps", type=int, default=100, help="measured steps per variant")
    p.add_argument("--block", type=int, default=4, help="consecutive steps of one variant")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured steps per variant first")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="run directory of the 'on' variant (kept)")
    p.add_argument("--heartbeat-s", type=float, default=None,
                   help="the watchdog's heartbeat, s (default: the recorder's)")  # fmt: skip
    p.add_argument("--format", choices=("both", "arrow", "jsonl"), default="both",
                   help="rank-file format of the 'on' variant (both: one job each)")  # fmt: skip
    args = p.parse_args(argv)
    if min(args.nproc, args.steps, args.block) < 1 or args.warmup < 0:
        p.error("--nproc, --steps and --block must be >= 1, --warmup >= 0")
    return args


# ---------------------------------------------------------------- launcher


_LAUNCHER_OPTIONS = ("--nproc", "--format")


def rank_argv(argv: list[str]) -> list[str]:
    """`argv` without the launcher's own options (`--nproc N`, `--nproc=N`, `--format F`)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _LAUNCHER_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in _LAUNCHER_OPTIONS)):
            out.append(arg)
    return out


def launch(argv: list[str], args: argparse.Namespace) -> int:
    """Re-run this file under torchrun with `args.nproc` ranks, once per format asked for."""
    formats = ("arrow", "jsonl") if args.format == "both" else (args.format,)
    for fmt in formats:
        print(f"\n=== rank files: {fmt}", flush=True)
        code = launch_one([*rank_argv(argv), "--format", fmt], args, fmt)
        if code != 0:
            return code
    return 0


def launch_one(argv: list[str], args: argparse.Namespace, fmt: str) -> int:
    tmp = None if args.out else tempfile.mkdtemp(prefix="diag-overhead-")
    out = f"{args.out}-{fmt}" if args.out else os.path.join(tmp or "", "run")
    env = {**os.environ, _CHILD_ENV: "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.nproc}",
        os.path.abspath(__file__),
        *argv,
        "--out",
        out,
    ]
    try:
        return subprocess.call(cmd, env=env)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- one rank


@dataclass
class Variant:
    name: str
    ddp: Any
    optimizer: Any
    batches: Iterator[Any]
    rec: Any = None  # Recorder, NullRecorder, or None for the plain loop
    times: list[float] = field(default_factory=list)


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from collectors import NullRecorder, Recorder, register_recording_hook
    from reference_runs.common import init_distributed
    from reference_runs.data import SyntheticTokens, iterate_batches, make_loader
    from reference_runs.model import GPT, GPTConfig

    env = init_distributed()  # gloo on CPU (NCCL on GPUs); one thread per rank
    torch.set_num_threads(1)
    config = GPTConfig(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        seq_len=args.seq,
        vocab=args.vocab,
    )
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    samples = args.micro_batch * env.world_size * 4
    dataset = SyntheticTokens(samples, args.seq, args.vocab, seed=args.seed)

    variants: dict[str, Variant] = {}
    for name in VARIANTS:
        torch.manual_seed(args.seed)  # identical weights for every variant
        model = GPT(config).to(env.device)
        ddp = DDP(model, device_ids=device_ids, bucket_cap_mb=args.bucket_mb)
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
        loader, sampler = make_loader(dataset, args.micro_batch, env.rank, env.world_size, 0)
        v = Variant(name, ddp, optimizer, iterate_batches(loader, sampler, set_epoch=True))
        if name == "on":
            rec = Recorder.from_env(
                args.out,
                model=model,
                optimizer=optimizer,
                trainer="dp",
                trace_collectives=True,
                track_activations=True,
                device=env.device,
                format="jsonl" if args.format == "jsonl" else "arrow",
                watchdog=True,
                heartbeat_s=args.heartbeat_s,
            )
            assert isinstance(rec, Recorder)
            rec.register_group("dp", None)
            register_recording_hook(rec, ddp)
            v.rec = rec
        elif name == "off":
            v.rec = NullRecorder()
        variants[name] = v

    tokens = args.micro_batch * args.seq

    def recorded_step(v: Variant) -> None:  # the loop of reference_runs/dp.py
        rec = v.rec
        with rec.step(tokens=tokens) as step:
            with rec.span("data", mb=0):
                inputs, targets = (t.to(env.device) for t in next(v.batches))
            with rec.span("fwd", mb=0):
                _, loss = v.ddp(inputs, targets)
            with rec.span("bwd", mb=0):
                loss.backward()
            with rec.span("opt"):
                v.optimizer.step()
                v.optimizer.zero_grad(set_to_none=True)
            step.loss = loss.item()

    def plain_step(v: Variant) -> None:
        inputs, targets = (t.to(env.device) for t in next(v.batches))
        _, loss = v.ddp(inputs, targets)
        loss.backward()
        v.optimizer.step()
        v.optimizer.zero_grad(set_to_none=True)
        loss.item()

    def run(v: Variant, steps: int, measure: bool) -> None:
        step_fn: Callable[[Variant], None] = plain_step if v.rec is None else recorded_step
        for _ in range(steps):
            t0 = time.perf_counter()
            step_fn(v)
            if measure:
                v.times.append(time.perf_counter() - t0)

    for v in variants.values():
        run(v, args.warmup, measure=False)
    rounds = -(-args.steps // args.block)
    for r in range(rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for name in order:
            n = min(args.block, args.steps - r * args.block)
            run(variants[name], n, measure=True)

    on_rec = variants["on"].rec
    on_rec.close()
    mine = {name: v.times for name, v in variants.items()}
    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, mine)
    if env.rank == 0:
        report(args, env.world_size, gathered)
    dist.destroy_process_group()


def report(args: argparse.Namespace, world: int, per_rank: list[dict[str, list[float]]]) -> None:
    # a step lasts as long as its slowest rank
    steps = {name: [max(ts) for ts in zip(*(r[name] for r in per_rank), strict=True)]
             for name in VARIANTS}  # fmt: skip
    median = {name: statistics.median(ts) for name, ts in steps.items()}
    print(
        f"\ncollector overhead: {world} ranks, {args.steps} measured steps per variant in blocks "
        f"of {args.block} (after {args.warmup} warm-up), GPT layers={args.layers} "
        f"hidden={args.hidden} seq={args.seq} micro_batch={args.micro_batch}"
    )
    print(f"{'variant':<8}{'median ms':>11}{'p10 ms':>9}{'p90 ms':>9}{'rank medians ms':>24}")
    for name, ts in steps.items():
        deciles = statistics.quantiles(ts, n=10) if len(ts) > 1 else [ts[0]] * 9
        ranks = " ".join(f"{statistics.median(r[name]) * 1e3:.2f}" for r in per_rank)
        print(
            f"{name:<8}{median[name] * 1e3:>11.2f}{deciles[0] * 1e3:>9.2f}"
            f"{deciles[-1] * 1e3:>9.2f}{ranks:>24}"
        )
    # the same ratio from neighbouring blocks only (each round runs every variant once)
    rounds = [
        statistics.median(steps["on"][i : i + args.block])
        / statistics.median(steps["off"][i : i + args.block])
        for i in range(0, args.steps, args.block)
    ]
    print(f"on/off per round (median of {len(rounds)}): {statistics.median(rounds):.3f}")
    print(f"'on' recorded on rank 0: {count_records(args.out)}")
    print(f"disabled recorder vs plain code (off/plain): {median['off'] / median['plain']:.3f}")
    print(f"collectors with watchdog vs uninstrumented (on/plain): "
          f"{median['on'] / median['plain']:.3f}")  # fmt: skip
    print(f"collector overhead (on/off step time): {median['on'] / median['off']:.3f}")


def count_records(run_dir: str) -> str:
    """Records per kind in rank 0's file: evidence that the 'on' variant really recorded."""
    from pathlib import Path

    from diag.read.load import read_rank_file

    path = next(p for p in Path(run_dir).glob("rank-00000.*"))
    part = read_rank_file(0, path)
    counts = {kind: len(table["step"]) for kind, table in part.columns.items()}
    return f"{path.name}: " + ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if os.environ.get(_CHILD_ENV) != "1":
        return launch(argv, args)
    rank_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
