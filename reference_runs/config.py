"""The command-line options every reference trainer shares (docs/trainers.md).

`add_common_args` adds them to a parser; `parse_config` parses argv into a validated
`TrainConfig`. Bad values are argparse errors (exit code 2, one line naming the option).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from diag.contract.injections import parse_injection
from diag.contract.names import SCHEDULES
from reference_runs.model import ATTENTION_KINDS, GPTConfig
from reference_runs.topology import Axis, Topology

CLIP_GRAD_TRAINERS = ("dp", "zero3", "custom")  # trainers that know their global grad norm


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind.__name__}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    convert.__name__ = f"positive {kind.__name__}"
    return convert


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def parse_profile_steps(text: str) -> tuple[int, int]:
    """'A:B' -> (A, B): profile steps A (inclusive) to B (exclusive), 0 <= A < B."""
    start, sep, stop = text.partition(":")
    try:
        if not sep:
            raise ValueError
        window = (int(start), int(stop))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected A:B with integers A < B, got {text!r}"
        ) from None
    if not 0 <= window[0] < window[1]:
        raise argparse.ArgumentTypeError(f"expected 0 <= A < B, got {text!r}")
    return window


def _injection(text: str) -> str:
    try:
        parse_injection(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


@dataclass
class TrainConfig:
    trainer: str = "custom"  # which reference trainer: dp|tp|pp|ep|zero3|custom
    out: str | None = None  # run directory; None = the caller picks runs/<trainer>-<timestamp>
    steps: int = 10  # optimizer steps to run
    layers: int = 2  # transformer blocks
    hidden: int = 128  # model width
    heads: int = 4  # attention heads
    seq: int = 64  # sequence length in tokens
    micro_batch: int = 4  # sequences per micro-batch per DP rank
    vocab: int = 512  # vocabulary size
    dp: int | None = None  # data-parallel degree; None = the trainer's default
    tp: int | None = None  # tensor-parallel degree; None = the trainer's default
    pp: int | None = None  # pipeline stages; None = the trainer's default
    ep: int | None = None  # expert-parallel degree; None = the trainer's default
    microbatches: int = 1  # pipeline micro-batches per step
    schedule: str = "1f1b"  # pipeline schedule: 1f1b|gpipe|interleaved
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B)
    experts: int = 4  # MoE experts per layer
    topk: int = 2  # experts each token is routed to
    capacity_factor: float = 1.25  # expert capacity = factor * tokens * topk / experts
    aux_loss_coef: float = 0.01  # weight of the load-balancing auxiliary loss
    bucket_mb: float = 25.0  # DDP gradient bucket size, MiB
    grad_accum: int = 1  # micro-batches accumulated per optimizer step (DP)
    sequence_parallel: bool = False  # Megatron sequence parallelism with TP
    gpus_per_node: int | None = None  # virtual topology: host = rank // gpus_per_node
    device_memory_gb: float | None = None  # declared device memory, GB (for the memory check)
    profile_steps: tuple[int, int] | None = None  # Kineto trace window [start, stop)
    seed: int = 0  # seeds the model, the data and the sampler
    inject: list[str] = field(
        default_factory=list
    )  # fault-injection specs (diag/contract/injections.py)
    lr: float = 3e-4  # AdamW learning rate
    attention: str = "sdpa"  # attention kernel: sdpa (fused) | naive (keeps seq x seq scores)
    clip_grad: float | None = None  # clip the global gradient norm to this; None = no clipping
    no_collectors: bool = False  # run without instrumentation (overhead baseline)
    # whether --layers was given (else the pp trainer may pick one block per stage); how the
    # config was written, not what it is, so equal configs compare equal either way
    layers_given: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        if self.hidden % self.heads != 0:
            raise ValueError(
                f"--hidden ({self.hidden}) must be divisible by --heads ({self.heads})"
            )
        if self.topk > self.experts:
            raise ValueError(f"--topk ({self.topk}) must be <= --experts ({self.experts})")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for spec in self.inject:
            parse_injection(spec)
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(
                f"--attention must be one of {ATTENTION_KINDS}, got {self.attention!r}"
            )
        if self.clip_grad is not None and self.trainer not in CLIP_GRAD_TRAINERS:
            raise ValueError(
                f"--clip-grad is supported by the {', '.join(CLIP_GRAD_TRAINERS[:-1])} trainers, "
                f"not {self.trainer}"
            )

    def gpt_config(self) -> GPTConfig:
        return GPTConfig(
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            seq_len=self.seq,
            vocab=self.vocab,
            attention=self.attention,
        )

    def topology(self, world_size: int, default_axis: Axis = "dp") -> Topology:
        """The validated grid for `world_size` ranks; `default_axis` takes what is not given."""
        return Topology.from_sizes(
            world_size,
            dp=self.dp,
            tp=self.tp,
            pp=self.pp,
            ep=self.ep,
            default_axis=default_axis,
            gpus_per_node=self.gpus_per_node,
        )


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the options shared by all reference trainers (the names docs/trainers.md gives)."""
    pos_int, pos_float = _positive(int), _positive(float)
    d = TrainConfig()
    model = parser.add_argument_group("model")
    model.add_argument("--layers", type=pos_int, default=d.layers, help="transformer blocks")
    model.add_argument("--hidden", type=pos_int, default=d.hidden, help="model width")
    model.add_argument("--heads", type=pos_int, default=d.heads, help="attention heads")
    model.add_argument("--seq", type=pos_int, default=d.seq, help="sequence length")
    model.add_argument(
        "--micro-batch", type=pos_int, default=d.micro_batch, help="sequences per DP rank"
    )
    model.add_argument("--vocab", type=pos_int, default=d.vocab, help="vocabulary size")
    model.add_argument(
        "--attention", choices=ATTENTION_KINDS, default=d.attention,
        help="naive keeps the seq x seq scores for backward (activations grow with seq^2)",
    )  # fmt: skip

    layout = parser.add_argument_group("layout")
    for axis in ("dp", "tp", "pp", "ep"):
        layout.add_argument(f"--{axis}", type=pos_int, default=None, help=f"{axis} degree")
    layout.add_argument("--microbatches", type=pos_int, default=d.microbatches)
    layout.add_argument("--schedule", choices=SCHEDULES, default=d.schedule)
    layout.add_argument("--virtual-stages", type=pos_int, default=d.virtual_stages)
    layout.add_argument("--experts", type=pos_int, default=d.experts)
    layout.add_argument("--topk", type=pos_int, default=d.topk)
    layout.add_argument("--capacity-factor", type=pos_float, default=d.capacity_factor)
    layout.add_argument("--aux-loss-coef", type=_nonneg_float, default=d.aux_loss_coef)
    layout.add_argument("--bucket-mb", type=pos_float, default=d.bucket_mb, help="MiB")
    layout.add_argument("--grad-accum", type=pos_int, default=d.grad_accum)
    layout.add_argument("--sequence-parallel", action="store_true")
    layout.add_argument(
        "--gpus-per-node", type=pos_int, default=None, help="virtual hosts: rank // K"
    )
    layout.add_argument("--device-memory-gb", type=pos_float, default=None)

    run = parser.add_argument_group("run")
    run.add_argument("--steps", type=pos_int, default=d.steps)
    run.add_argument("--out", default=None, help="run directory")
    run.add_argument("--lr", type=pos_float, default=d.lr, help="learning rate")
    run.add_argument(
        "--clip-grad", type=pos_float, default=None, metavar="X",
        help="clip the global gradient norm to X; records local and global norms (dp, zero3)",
    )  # fmt: skip
    run.add_argument("--seed", type=int, default=d.seed)
    run.add_argument("--profile-steps", type=parse_profile_steps, default=None, metavar="A:B")
    run.add_argument(
        "--inject", type=_injection, action="append", default=[], metavar="SPEC",
        help="fault injection, repeatable (straggler:rank=R,ms=M, slow-comm:ms=M[,group=G], "
        "skew:frac=F[,expert=E], skew-growth:per_step=G, leak:mb=X, slowdown:ms=M[,rank=R], "
        "no-set-epoch, stage-slow:stage=S,ms=M, jitter:ms=M, loader-stall:rank=R,ms=M; a job "
        "that fails: hang|crash|desync|kill:rank=R,step=S)",
    )  # fmt: skip
    run.add_argument("--no-collectors", action="store_true", help="run uninstrumented")
    return parser


def parse_config(argv: list[str] | None, trainer: str) -> TrainConfig:
    """Parse argv (None = sys.argv[1:]); invalid options exit with code 2 via argparse."""
    argv = sys.argv[1:] if argv is None else argv
    parser = add_common_args(argparse.ArgumentParser(prog=f"reference_runs.{trainer}"))
    args = parser.parse_args(argv)
    names = {f.name for f in fields(TrainConfig)}
    layers_given = any(a == "--layers" or a.startswith("--layers=") for a in argv)
    try:
        return TrainConfig(
            trainer=trainer,
            layers_given=layers_given,
            **{k: v for k, v in vars(args).items() if k in names},
        )
    except ValueError as exc:
        parser.error(str(exc))
