"""The counterfactual "every rank had its cores": each rank's step without the time it waited for a
core (`diag.metrics.host.host_steps`, which the metrics compute once).

Where in the step a rank waited for a core is not recorded, only how long over the step, so
each of the step's pieces (local time before each event, each transfer) is shrunk by the
share of that rank-step spent waiting: a host that stole a third of the step slowed its
compute and its communication threads alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.whatif.replay import Durations

MIN_SHARE = 0.01
"""A rank that waited for a core less than this share of its steps is not named."""


def shares_per_event(table: pd.DataFrame, rank: np.ndarray, step: np.ndarray) -> np.ndarray | None:
    """Per event (its rank and step), the share of its rank-step spent waiting for a core (0 where
    not recorded), from `table` (`diag.metrics.host.host_steps`); None when no step recorded it."""
    if table.empty or table["descheduled_s"].isna().all():
        return None
    wall = table["wall_s"].where(table["wall_s"] > 0)
    share = (table["descheduled_s"] / wall).clip(0.0, 1.0).fillna(0.0)
    keyed = pd.Series(share.to_numpy(), index=pd.MultiIndex.from_arrays(
        [table["rank"].to_numpy(np.int64), table["step"].to_numpy(np.int64)]))  # fmt: skip
    keyed = keyed[~keyed.index.duplicated()]
    at = pd.MultiIndex.from_arrays([rank.astype(np.int64), step.astype(np.int64)])
    return keyed.reindex(at).fillna(0.0).to_numpy()


def with_cores(base: Durations, share: np.ndarray) -> Durations:
    """`base` with each event's local time and transfer shrunk by its rank-step's share."""
    keep = 1.0 - share
    return Durations(base.seg_ns * keep, base.transfer_ns * keep, base.post_ns)


def waiting_ranks(rank: np.ndarray, share: np.ndarray) -> list[int]:
    """The ranks whose mean share over their events is at least MIN_SHARE."""
    mean = pd.Series(share).groupby(rank).mean()
    return sorted(int(r) for r in mean[mean >= MIN_SHARE].index)
