"""Topology rules: parallel groups against the hosts they run on (the seed's first question:
are TP and EP inside a node?), and heterogeneous devices inside a group."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from diag.contract import schema
from diag.rules.engine import Finding, RuleContext, rule

FAST_AXES = ("tp", "ep", "cp")
"""Axes whose collectives run every layer and must stay on the fast intra-node links."""


def _hosts(manifest: schema.Manifest) -> dict[int, str] | None:
    """Host of every rank, or None unless every rank of the world has one."""
    hosts = {info.rank: info.host for info in manifest.ranks if info.host}
    return hosts if len(hosts) == manifest.world_size else None


def _spanning(manifest: schema.Manifest, axis: str) -> list[list[int]]:
    hosts = _hosts(manifest)
    if hosts is None:
        return []
    return [sorted(g) for g in manifest.groups.get(axis, []) if len({hosts.get(r) for r in g}) > 1]


def _ranks_per_host(manifest: schema.Manifest) -> int | None:
    if manifest.hardware.gpus_per_node:
        return int(manifest.hardware.gpus_per_node)
    hosts = _hosts(manifest)
    return max(Counter(hosts.values()).values()) if hosts else None


@rule("TOP001", "topology.fast_group_spans_hosts", pattern=1)
def fast_group_spans_hosts(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """A tensor- or expert-parallel group spans hosts: its per-layer collectives cross the slow
    inter-node link.

    Symptom:
        A TP (or EP) group holds ranks on different hosts, so every layer's all-reduce (or
        all-to-all) goes over the inter-node network (~50 GB/s against ~900 GB/s NVLink).
    Likely cause:
        TP larger than the GPUs per node, or a device mesh whose TP axis is not innermost.
    Fix:
        Keep TP and EP <= GPUs per node and innermost in the mesh (TP/EP inside a node, PP
        across nodes, DP over what remains); use PP or DP for the rest of the ranks.
    Evidence:
        The manifest's groups of axes tp/ep/cp and each rank's host; the groups that span hosts.
    """
    manifest = ctx.run.manifest
    findings = []
    for axis in FAST_AXES:
        groups = _spanning(manifest, axis)
        if not groups:
            continue
        hosts = _hosts(manifest) or {}
        size = getattr(manifest.layout, axis, 1) or 1
        findings.append(
            Finding(
                severity="high" if axis == "tp" else "medium",
                title=f"{axis.upper()}={size} groups span hosts: per-layer collectives cross the "
                "inter-node link",
                ranks=sorted({r for g in groups for r in g}),
                evidence={
                    "axis": axis,
                    "size": size,
                    "gpus_per_node": _ranks_per_host(manifest),
                    "groups": [
                        {"ranks": g, "hosts": sorted({hosts[r] for r in g})} for g in groups
                    ],
                },
                advice=f"keep {axis.upper()} inside a node (<= GPUs per node, innermost mesh "
                "axis); put PP across nodes and DP over the rest",
            )
        )
    return findings


@rule("TOP002", "topology.group_layout_mismatch", pattern=3)
def group_layout_mismatch(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """A group spans more hosts than its size needs: the mesh does not follow the topology.

    Symptom:
        A TP/EP/CP group of size k spans more hosts than ceil(k / GPUs per node), e.g. TP=2 on
        ranks 0 and 2 with 2 GPUs per node, although ranks 0 and 1 share a node.
    Likely cause:
        The device mesh's axes in the wrong order (TP not innermost), ranks numbered across
        nodes, or groups built by hand without the topology.
    Fix:
        Declare the mesh against the hardware: rank = ((dp·pp + pp_i)·ep + ep_i)·tp + tp_i, TP
        innermost, so every TP group holds consecutive local ranks of one node.
    Evidence:
        Each mismatched group with its hosts, and the fewest hosts it could occupy.
    """
    manifest = ctx.run.manifest
    per_host = _ranks_per_host(manifest)
    hosts = _hosts(manifest)
    if not per_host or hosts is None:
        return []
    bad: list[dict[str, Any]] = []
    for axis in FAST_AXES:
        for group in manifest.groups.get(axis, []):
            used = len({hosts[r] for r in group})
            needed = math.ceil(len(group) / per_host)
            if used > needed:
                bad.append({"axis": axis, "ranks": sorted(group), "hosts": used, "needed": needed})
    if not bad:
        return []
    return [
        Finding(
            severity="medium",
            title=f"{len(bad)} group(s) span more hosts than their size needs (mesh order)",
            ranks=sorted({r for b in bad for r in b["ranks"]}),
            evidence={"gpus_per_node": per_host, "groups": bad},
            advice="order the device mesh with TP (then EP) innermost so each group holds "
            "consecutive ranks of one node",
        )
    ]


@rule(
    "TOP003",
    "topology.heterogeneous_devices",
    pattern=None,
)
def heterogeneous_devices(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Different device models inside one TP or PP group: the slowest paces the group.

    Symptom:
        The manifest's device_name differs between ranks of one tensor- or pipeline-parallel
        group (e.g. H100 and A100 in one TP group, ~3x apart).
    Likely cause:
        A heterogeneous cluster or a scheduler that mixed node types in one job.
    Fix:
        Keep each TP/PP group on one device model; if the job must mix, put the slower devices
        in their own DP replicas or give their stages fewer layers.
    Evidence:
        Each group whose ranks report different device names, and the ranks whose device is not
        the group's most common one.
    """
    manifest = ctx.run.manifest
    devices = {info.rank: info.device_name for info in manifest.ranks if info.device_name}
    mixed: list[dict[str, Any]] = []
    odd: set[int] = set()
    for axis in ("tp", "pp"):
        for group in manifest.groups.get(axis, []):
            names = [devices[r] for r in group if r in devices]
            if len(set(names)) < 2:
                continue
            common = Counter(names).most_common(1)[0][0]
            odd |= {r for r in group if devices.get(r) not in (None, common)}
            mixed.append({"axis": axis, "ranks": sorted(group),
                          "devices": {r: devices.get(r) for r in sorted(group)}})  # fmt: skip
    if not mixed:
        return []
    return [
        Finding(
            severity="medium",
            title=f"{len(mixed)} TP/PP group(s) mix device models: the slowest paces each",
            ranks=sorted(odd),
            evidence={"groups": mixed},
            advice="keep each TP/PP group on one device model; put different devices in "
            "separate DP replicas or give their stages less work",
        )
    ]
