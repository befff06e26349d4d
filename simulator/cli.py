"""`diag simulate`: parse the options, simulate, say where the run went (diag/cli/main.py adds
it)."""

from __future__ import annotations

import datetime as _dt
import shlex
import shutil
import sys
from pathlib import Path

import click

from diag.cli.options import EXIT_INPUT, fail, parse_layout
from diag.contract.names import SCHEDULES
from diag.errors import InputError
from simulator import simulate as run_simulation
from simulator.config import ModelSpec, SimConfig, SimulationError
from simulator.hardware import HardwareSpec
from simulator.kineto_shapes import TRACE_SHAPES, TRACED_RANKS
from simulator.kineto_writer import write_kineto
from simulator.reshape import TAG_STYLES, reshape_run

_HW = HardwareSpec()
_MODEL = ModelSpec()
_pos_int = click.IntRange(min=1)
_nonneg = click.FloatRange(min=0)


def _default_out() -> Path:
    return Path("runs") / f"sim-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


@click.command(context_settings={"show_default": True})
@click.option("--ranks", type=_pos_int, default=None, help="World size (default: the layout's).")
@click.option(
    "--layout", metavar="dp=N,tp=N,pp=N,ep=N", default=None,
    help="Parallel degrees (grid order, tp innermost); m=N and v=N set micro-batches and "
    "virtual stages. Default: dp = --ranks.",
)  # fmt: skip
@click.option("--gpus-per-node", type=_pos_int, default=8, help="Ranks per host (node<i>).")
@click.option("--steps", type=_pos_int, default=10)
@click.option("--microbatches", "-m", type=_pos_int, default=None, help="Per step [default: 1].")
@click.option("--schedule", type=click.Choice(SCHEDULES), default="1f1b")
@click.option("--virtual-stages", type=_pos_int, default=None, help="Interleaved chunks (v).")
@click.option("--zero-stage", type=click.IntRange(0, 3), default=0, help="Memory sharding only.")
@click.option("--bucket-mb", type=click.FloatRange(min=0, min_open=True), default=25.0)
@click.option("--layers", type=_pos_int, default=_MODEL.layers)
@click.option("--hidden", type=_pos_int, default=_MODEL.hidden)
@click.option("--heads", type=_pos_int, default=_MODEL.heads)
@click.option("--seq-len", "--seq", "seq_len", type=_pos_int, default=_MODEL.seq_len)
@click.option("--micro-batch", type=_pos_int, default=_MODEL.micro_batch, help="Sequences.")
@click.option("--vocab", type=_pos_int, default=_MODEL.vocab)
@click.option("--ffn-hidden", type=_pos_int, default=None, help="[default: 4 x hidden]")
@click.option("--experts", type=click.IntRange(min=0), default=0, help="0: a dense model.")
@click.option("--topk", type=_pos_int, default=_MODEL.topk)
@click.option("--capacity-factor", type=click.FloatRange(min=0, min_open=True), default=1.25)
@click.option("--aux-loss-coef", type=_nonneg, default=_MODEL.aux_loss_coef)
@click.option("--dtype", default=_MODEL.dtype, help="bf16, fp16, fp32, fp8.")
@click.option("--lm-head/--no-lm-head", default=True, help="LM head FLOPs on the last stage.")
@click.option("--device-tflops", type=_nonneg, default=_HW.device_tflops, help="Peak, dense.")
@click.option("--mfu", type=click.FloatRange(0, 1, min_open=True), default=_HW.mfu)
@click.option("--hbm-gbps", "hbm_GBps", type=_nonneg, default=_HW.hbm_GBps)
@click.option("--device-memory-gb", type=_nonneg, default=_HW.device_memory_gb)
@click.option("--intra-node-gbps", "intra_node_GBps", type=_nonneg, default=_HW.intra_node_GBps)
@click.option("--inter-node-gbps", "inter_node_GBps", type=_nonneg, default=_HW.inter_node_GBps)
@click.option(
    "--nccl-efficiency", type=click.FloatRange(0, 1, min_open=True), default=_HW.nccl_efficiency
)
@click.option("--intra-latency-us", type=_nonneg, default=_HW.intra_latency_us)
@click.option("--inter-latency-us", type=_nonneg, default=_HW.inter_latency_us)
@click.option("--comm-scale", type=_nonneg, default=1.0, help="0: free communication.")
@click.option("--inject", multiple=True, metavar="SPEC", help="As `diag run --inject`.")
@click.option("--seed", type=int, default=0)
@click.option("--jitter", type=click.FloatRange(0, 1, max_open=True), default=0.02)
@click.option("--opt-ms", type=_nonneg, default=None, help="[default: from HBM bandwidth]")
@click.option("--fragmentation", type=_nonneg, default=0.05, help="Share of allocated bytes.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Run directory.")
@click.option(
    "--format", "rank_format", type=click.Choice(["arrow", "jsonl", "kineto"]), default="arrow",
    show_default=True, help="Rank files: Arrow IPC streams (.arrows) or JSON lines (.jsonl); "
    "kineto: no run directory but a folder of PyTorch profiler traces, one per rank, as a "
    "GPU job's profiler writes them (read it with --layout).",
)  # fmt: skip
@click.option(
    "--tags", type=click.Choice(TAG_STYLES), default="ours", show_default=True,
    help="Names on the records: ours, or Megatron's (forward-send, backward-recv ...; "
    "collectives untagged).",
)  # fmt: skip
@click.option(
    "--untraced", multiple=True, metavar="GROUP",
    help="Leave this group's collectives out of the records (repeatable): their waits become "
    "time in no record.",
)  # fmt: skip
@click.option(
    "--trace-shape", type=click.Choice(TRACE_SHAPES), default="devicemesh", show_default=True,
    help="With --format kineto: the traces' shape: DeviceMesh's group names; Megatron-LM's "
    "(and batched sends and receives: SendRecv kernels without arguments); old (PyTorch of "
    "2023: no group arguments, no pg_config, sizes as Input Dims); host-bound (short kernels "
    "each launched just before it runs); ring-cp (the tensor-parallel groups as context "
    "parallel ones passing key and value blocks round a ring).",
)  # fmt: skip
@click.option(
    "--traced-ranks", type=click.Choice(TRACED_RANKS), default="all", show_default=True,
    help="With --format kineto: every rank's trace, or one per tensor-parallel group.",
)  # fmt: skip
def simulate(**options: object) -> None:
    """Simulate a training job of any size and write its run directory (as `diag run` would):
    compute from FLOPs, collectives over intra/inter-node links, the pipeline schedule and
    the injections. See docs/simulator.md."""
    o = options
    try:
        config = build_config(o)
        out = o["out"] if isinstance(o["out"], Path) else _default_out()
        command = shlex.join(["diag", "simulate", *sys.argv[2:]])
        kineto = o["rank_format"] == "kineto"
        records = out.with_name(f".{out.name}.records") if kineto else out
        result = run_simulation(
            config, records, command, "arrow" if kineto else str(o["rank_format"])
        )
        untraced = o["untraced"] if isinstance(o["untraced"], tuple) else ()
        reshape_run(result.path, str(o["tags"]), [str(g) for g in untraced])
        if kineto:
            write_kineto(records, out, str(o["trace_shape"]), str(o["traced_ranks"]))
            shutil.rmtree(records)
    except SimulationError as err:
        click.echo(f"diag: error: {err}", err=True)
        raise SystemExit(EXIT_INPUT) from None
    except click.BadParameter as err:
        click.echo(f"diag: error: --layout: {err.message}", err=True)
        raise SystemExit(EXIT_INPUT) from None
    except OSError as err:
        fail(InputError(str(o["out"]), f"cannot write the run ({err.strerror or err})"))
    where, layout = "run directory", ""
    if o["rank_format"] == "kineto":
        where, layout = "profiler traces", f" --layout {layout_option(config)}"
        if o["trace_shape"] == "ring-cp":  # cp = the simulated tp, which --layout cannot say
            layout = ""  # for a trace folder yet: the traces' groups give it
    click.echo(
        f"simulated {result.world_size} ranks x {result.steps} steps in {result.seconds:.1f} s "
        f"({result.bytes / 1e6:.1f} MB)\n{where}: {out}\nnext: diag analyze {out}{layout}"
    )


def layout_option(config: SimConfig) -> str:
    """The `--layout` a trace folder of `config`'s job is read with."""
    return (f"dp={config.dp},tp={config.tp},pp={config.pp},ep={config.ep},"
            f"m={config.microbatches},v={config.virtual_stages}")  # fmt: skip


def build_config(o: dict[str, object]) -> SimConfig:
    """The SimConfig of the command's options; SimulationError or click.BadParameter."""
    layout = parse_layout(o["layout"] if isinstance(o["layout"], str) else None)
    ranks = o["ranks"] if isinstance(o["ranks"], int) else None
    if layout is None:
        if ranks is None:
            raise SimulationError("give --ranks N or --layout dp=..,tp=..,pp=..,ep=..")
        dp, tp, pp, ep, m, v = ranks, 1, 1, 1, 1, 1
    else:
        dp, tp, pp, ep = layout.dp, layout.tp, layout.pp, layout.ep
        m, v = layout.microbatches or 1, layout.virtual_stages or 1  # 0: not given
        if layout.cp != 1:
            raise SimulationError(f"context parallelism is not simulated (cp={layout.cp})")
    model = ModelSpec(
        layers=_int(o["layers"]), hidden=_int(o["hidden"]), heads=_int(o["heads"]),
        seq_len=_int(o["seq_len"]), micro_batch=_int(o["micro_batch"]), vocab=_int(o["vocab"]),
        ffn_hidden=o["ffn_hidden"] if isinstance(o["ffn_hidden"], int) else None,
        experts=_int(o["experts"]), topk=_int(o["topk"]),
        capacity_factor=_float(o["capacity_factor"]), aux_loss_coef=_float(o["aux_loss_coef"]),
        dtype=str(o["dtype"]), lm_head=bool(o["lm_head"]),
    )  # fmt: skip
    hardware = HardwareSpec(
        device_tflops=_float(o["device_tflops"]), mfu=_float(o["mfu"]),
        hbm_GBps=_float(o["hbm_GBps"]), device_memory_gb=_float(o["device_memory_gb"]),
        intra_node_GBps=_float(o["intra_node_GBps"]),
        inter_node_GBps=_float(o["inter_node_GBps"]),
        nccl_efficiency=_float(o["nccl_efficiency"]),
        intra_latency_us=_float(o["intra_latency_us"]),
        inter_latency_us=_float(o["inter_latency_us"]), comm_scale=_float(o["comm_scale"]),
    )  # fmt: skip
    inject = o["inject"]
    specs = tuple(str(s) for s in inject) if isinstance(inject, tuple) else ()
    return SimConfig(
        dp=dp, tp=tp, pp=pp, ep=ep, gpus_per_node=_int(o["gpus_per_node"]),
        steps=_int(o["steps"]),
        microbatches=o["microbatches"] if isinstance(o["microbatches"], int) else m,
        schedule=str(o["schedule"]),
        virtual_stages=o["virtual_stages"] if isinstance(o["virtual_stages"], int) else v,
        zero_stage=_int(o["zero_stage"]), bucket_mb=_float(o["bucket_mb"]), model=model,
        hardware=hardware, inject=specs,
        seed=_int(o["seed"]), jitter=_float(o["jitter"]),
        opt_ms=o["opt_ms"] if isinstance(o["opt_ms"], float) else None,
        fragmentation=_float(o["fragmentation"]), ranks=ranks,
    )  # fmt: skip


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value


def _float(value: object) -> float:
    assert isinstance(value, int | float)
    return float(value)
