"""Building the run manifest from what the ranks know about themselves."""

from __future__ import annotations

import datetime as _dt
import os
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from collectors.host import usable_cores
from diag.contract.names import WORLD, host_name
from diag.contract.schema import Hardware, Layout, Manifest, ModelInfo, RankInfo, known_fields


def device_name(device: torch.device) -> str:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return "cpu"


def gather_rank_infos(dist: Any, device: torch.device, gpus_per_node: int | None) -> list[RankInfo]:
    """Every rank's host, local rank, device and usable cores, gathered from all ranks (or this
    one alone).

    With `gpus_per_node` declared, `host` is the virtual host `node{rank // gpus_per_node}`
    (`diag.contract.names.host_name`).
    """
    mine = (socket.gethostname(), int(os.environ.get("LOCAL_RANK", 0)), device_name(device),
            usable_cores())  # fmt: skip
    if dist is not None:
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
    else:
        everyone = [mine]
    infos = []
    for rank, (machine, local_rank, name, cores) in enumerate(everyone):
        host = host_name(rank, gpus_per_node) if gpus_per_node else machine
        infos.append(RankInfo(rank=rank, host=host, local_rank=local_rank, device_name=name,
                              machine=machine, usable_cores=cores))  # fmt: skip
    return infos


def build_manifest(
    *,
    run_dir: Path,
    world_size: int,
    trainer: str,
    backend: str | None,
    device_type: str,
    layout: dict[str, Any] | None,
    model_info: dict[str, Any] | None,
    ranks: list[RankInfo],
    groups: dict[str, list[list[int]]] | None,
    hardware: dict[str, Any] | None,
    injections: list[str] | None,
) -> Manifest:
    command = os.environ.get("DIAG_COMMAND") or shlex.join(sys.argv)
    return Manifest(
        run_id=run_dir.resolve().name,
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        world_size=world_size,
        trainer=trainer,
        command=command,
        backend=backend,
        device_type=device_type,
        layout=known_fields(Layout, layout or {}),
        model=known_fields(ModelInfo, model_info or {}),
        ranks=ranks,
        groups=groups or {WORLD: [list(range(world_size))]},
        hardware=known_fields(Hardware, hardware or {}),
        injections=list(injections or []),
    )


@dataclass(kw_only=True)
class DataParallel:
    """A wrapper that synchronises gradients over a process group (DDP, FSDP2)."""

    wrapper: str  # ddp | fsdp
    group: Any  # the ProcessGroup it reduces over (never None: the default group's object)
    size: int  # ranks in that group
    tag: str | None  # the tag its gradient collectives are recorded with (None: unrecorded)
    zero_stage: int = 0  # FSDP2's full sharding is ZeRO-3
    hook: str | None = None  # the user's DDP communication hook, by name


def declare_data_parallel(dist: Any, dp: DataParallel, world_size: int) -> list[list[int]]:
    """Every DP replica group's ranks, as the manifest's `groups["dp"]` lists them.

    A group spanning the world is the only one; a smaller group's peers are gathered from all
    ranks (a collective on the default group, so every rank must call this).
    """
    if dp.size == world_size:
        return [list(range(world_size))]
    mine = [int(r) for r in dist.get_process_group_ranks(dp.group)]
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, mine)
    return sorted({tuple(ranks): list(ranks) for ranks in everyone}.values())
