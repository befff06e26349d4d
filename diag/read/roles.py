"""Which pipeline stage, TP position and role each rank has: ranks of one role do the same
work, so they are the peers a rank's times are held against."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.read.load import RunData


def rank_stages(spans: pd.DataFrame, manifest: schema.Manifest) -> dict[int, int]:
    """The pipeline stage of every rank: the most frequent `stage` of its spans; for a rank
    without one, its position in its manifest `pp` group; else the grid order
    rank = ((dp_i·pp + pp_i)·ep + ep_i)·tp + tp_i (reference_runs/topology.py)."""
    layout = manifest.layout
    pp, inner = layout.pp or 1, (layout.ep or 1) * (layout.tp or 1)
    stages = {r: (r // inner) % pp for r in range(manifest.world_size)}
    for group in manifest.groups.get("pp", []):
        stages.update((r, i) for i, r in enumerate(sorted(group)))
    staged = spans.loc[spans["stage"].notna(), ["rank", "stage"]].astype("int64")
    if not staged.empty:  # each rank's most frequent stage, the lowest on a tie
        counts = staged.value_counts().reset_index(name="n")
        counts = counts.sort_values(["rank", "n", "stage"], ascending=[True, False, True])
        modes = counts.drop_duplicates("rank")
        stages.update(zip(modes["rank"].tolist(), modes["stage"].tolist(), strict=True))
    return stages


def rank_roles(run: RunData, ranks: np.ndarray) -> pd.DataFrame:
    """Per rank, its pipeline stage and TP position, and its role: ranks of one role do the
    same work (the peers a rank is held against)."""
    manifest = run.manifest
    stages = rank_stages(run.spans, manifest) if (manifest.layout.pp or 1) > 1 else {}
    tp = {int(r): i for members in manifest.groups.get("tp", []) for i, r in enumerate(members)}
    tp_size = manifest.layout.tp or 1
    frame = pd.DataFrame(index=pd.Index(ranks.astype(int), name="rank"))
    frame["stage"] = [int(stages.get(int(r), 0)) for r in frame.index]
    frame["tp_position"] = [tp.get(int(r), int(r) % tp_size) for r in frame.index]
    frame["role"] = frame["stage"] * 100_000 + frame["tp_position"]
    sizes = frame.groupby("role")["stage"].transform("size")
    frame.loc[sizes < 2, "role"] = frame.loc[sizes < 2, "stage"] * 100_000 - 1  # peers: its stage
    # a rank alone in its pipeline stage has no peers: the stage rules compare stages
    if frame["stage"].nunique() == 1:  # no pipeline: every rank does the same work
        sizes = frame.groupby("role")["stage"].transform("size")
        frame.loc[sizes < 2, "role"] = -1
    return frame
