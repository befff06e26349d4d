"""`diag run` and `diag demo`: launch a reference trainer under torchrun, one process per rank.

Before any rank starts, `python -m reference_runs.preflight` parses the trainer's options and
plans its layout with the trainer's own `plan(cfg, world_size) -> Topology` (the `Plan`
protocol of reference_runs/common.py), in a process of its own: `diag` does not import the
trainers. A bad option or an impossible layout is then one line and exit code 2, before
torchrun and before the run directory exists.

With GPUs present the trainer uses NCCL and one GPU per rank; otherwise gloo on CPU. Multi-node
runs pass `--nnodes`, `--node-rank` and `--rdzv-endpoint` through to torchrun (run the same
command on every node); a single node uses torchrun's `--standalone` rendezvous.
"""

from __future__ import annotations

import datetime as _dt
import os
import shlex
import subprocess
import sys
from pathlib import Path

import click

from diag.contract.names import TRAINERS

# Trainer name -> module run by torchrun.
TRAINER_MODULES = {trainer: f"reference_runs.{trainer}" for trainer in TRAINERS}


def default_run_dir(trainer: str) -> Path:
    return Path("runs") / f"{trainer}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def default_nproc() -> int:
    import torch

    return torch.cuda.device_count() or 4


def torchrun_command(
    module: str,
    trainer_args: list[str],
    nproc: int,
    nnodes: int | None = None,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nnodes is None and rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise click.UsageError("--nnodes needs --rdzv-endpoint HOST:PORT")
        cmd += [f"--nnodes={nnodes or 1}", "--rdzv-backend=c10d"]
        cmd.append(f"--rdzv-endpoint={rdzv_endpoint}")
        if node_rank is not None:
            cmd.append(f"--node-rank={node_rank}")
    return [*cmd, "-m", module, *trainer_args]


def launch(
    trainer: str,
    trainer_args: list[str],
    out: Path,
    nproc: int,
    nnodes: int | None = None,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
    quiet: bool = False,
) -> int:
    """Validate the trainer's options, run it under torchrun and return torchrun's exit code."""
    args = [*trainer_args, "--out", str(out)]
    preflight(trainer, args, nproc * (nnodes or 1))
    cmd = torchrun_command(TRAINER_MODULES[trainer], args, nproc, nnodes, node_rank, rdzv_endpoint)
    env = {
        **os.environ,
        "DIAG_COMMAND": shlex.join(["diag", "run", trainer, f"--nproc={nproc}", *args]),
        "PYTHONUNBUFFERED": "1",
    }
    if quiet:
        result = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        return result.returncode
    return subprocess.call(cmd, env=env)


def preflight(trainer: str, trainer_args: list[str], world_size: int) -> None:
    """Check the trainer's options and layout for `world_size` ranks before any rank starts
    (reference_runs/preflight.py); on a bad one, say why (one line) and exit with its code, 2."""
    cmd = [sys.executable, "-m", "reference_runs.preflight", trainer, str(world_size)]
    result = subprocess.run([*cmd, *trainer_args], capture_output=True, text=True)
    if result.returncode != 0:
        click.echo(result.stderr.rstrip("\n"), err=True)
        sys.exit(result.returncode)


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    epilog="Other options go to the trainer: `python -m reference_runs.TRAINER --help` lists them.",
)
@click.argument("trainer", type=click.Choice(list(TRAINER_MODULES)))
@click.option("--nproc", type=click.IntRange(min=1), default=None, help="Ranks on this node.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Run directory.")
@click.option("--nnodes", type=click.IntRange(min=1), default=None, help="Nodes (torchrun).")
@click.option("--node-rank", type=click.IntRange(min=0), default=None, help="This node's rank.")
@click.option("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous (multi-node).")
@click.pass_context
def run(
    ctx: click.Context,
    trainer: str,
    nproc: int | None,
    out: Path | None,
    nnodes: int | None,
    node_rank: int | None,
    rdzv_endpoint: str | None,
) -> None:
    """Run a reference trainer with collectors on, writing a run directory."""
    out = out or default_run_dir(trainer)
    code = launch(
        trainer, list(ctx.args), out, nproc or default_nproc(), nnodes, node_rank, rdzv_endpoint
    )
    if code == 0:
        click.echo(f"run directory: {out}\nnext: diag analyze {out}")
    sys.exit(code)


DEMO_ARGS = ["--steps", "12", "--inject", "straggler:rank=1,ms=60"]


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Run directory.")
def demo(out: Path | None) -> None:
    """Run a short faulty DP job (4 ranks, rank 1 a straggler) and print its diagnosis."""
    from diag.api import analyze_path
    from diag.outputs.report import render_text

    out = out or default_run_dir("demo")
    click.echo(f"diag demo: DP on 4 ranks, {' '.join(DEMO_ARGS)} -> {out}", err=True)
    code = launch("dp", DEMO_ARGS, out, nproc=4, quiet=True)
    if code != 0:
        click.echo(f"diag: error: the demo run failed (exit {code})", err=True)
        sys.exit(code)
    click.echo(render_text(analyze_path(out)))
