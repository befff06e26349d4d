"""Cases for the topology family: groups against hosts, devices within a group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rule_cases import RuleCase


def _run(
    runs: Any,
    groups: dict[str, list[list[int]]],
    layout: dict[str, int],
    devices: list[str] | None = None,
) -> Path:
    """4 ranks on 2 hosts (h0: ranks 0, 1; h1: ranks 2, 3), 2 GPUs per node, 3 plain steps."""
    infos = [{"rank": r, "host": f"h{r // 2}", "local_rank": r % 2} for r in range(4)]
    for info, name in zip(infos, devices or [], strict=False):
        info["device_name"] = name
    manifest = runs.manifest(
        world_size=4, layout=layout, groups=groups, ranks=infos,
        hardware={"gpus_per_node": 2},
    )  # fmt: skip
    return runs.write({r: runs.simple_rank() for r in range(4)}, manifest)


TP4 = {"tp": [[0, 1, 2, 3]]}
TP2_IN_NODE = {"tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]]}
TP2_ACROSS = {"tp": [[0, 2], [1, 3]], "dp": [[0, 1], [2, 3]]}
PP2_DP2 = {"pp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]]}
TP_LAYOUT = {"dp": 2, "tp": 2}

CASES = [
    RuleCase("TOP001", True, lambda runs: _run(runs, TP4, {"dp": 1, "tp": 4}),
             "TP=4 with 2 GPUs per node spans both hosts", severity="high", ranks=(0, 1, 2, 3)),
    RuleCase("TOP001", False, lambda runs: _run(runs, TP2_IN_NODE, TP_LAYOUT),
             "TP=2 groups inside a node; DP across hosts is fine"),
    RuleCase("TOP002", True, lambda runs: _run(runs, TP2_ACROSS, TP_LAYOUT),
             "TP=2 on ranks 0 and 2 although 0 and 1 share a node",
             severity="medium", ranks=(0, 1, 2, 3)),
    RuleCase("TOP002", False, lambda runs: _run(runs, TP4, {"dp": 1, "tp": 4}),
             "TP=4 needs both hosts: the size, not the layout"),
    RuleCase("TOP003", True,
             lambda runs: _run(runs, PP2_DP2, {"dp": 2, "pp": 2}, ["H100", "A100"] * 2),
             "H100 and A100 in each PP group", severity="medium", ranks=(1, 3)),
    RuleCase("TOP003", False,
             lambda runs: _run(runs, PP2_DP2, {"dp": 2, "pp": 2}, ["H100"] * 4),
             "one device model everywhere"),
]  # fmt: skip
