"""The sample order of each epoch, per rank (the `epoch` events' `order_hash`), which PIT001
(`pitfalls.set_epoch`) compares across epochs. Read here from the events' fields once, so that a
growing run (`diag.LiveRun`) reads each step's events as it takes the step in and keeps the rows,
not every event again after every step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

ORDER_COLUMNS = ["rank", "step", "epoch", "digest"]
DERIVED_NAME = "epoch_orders"
"""The name of `last_orders` in a rule context's derived values (`RuleContext.derived`)."""


def epoch_orders(events: pd.DataFrame) -> pd.DataFrame:
    """One row per `epoch` event whose epoch is an integer and that carries an order hash:
    `rank, step, epoch` (an integer; True counts as 1) and `digest` (the hash as a string), in
    the events' order."""
    if events.empty or "fields" not in events:
        events = pd.DataFrame({"rank": [], "step": [], "name": [], "fields": []})
    epochs = events[events["name"] == "epoch"]
    fields = [found or {} for found in epochs["fields"].tolist()]
    numbers = [found.get("epoch") for found in fields]  # (lists of untracked objects: no
    digests = [found.get("order_hash") for found in fields]  # tuples for the collector)
    keep = [isinstance(n, int) and d is not None for n, d in zip(numbers, digests, strict=True)]
    kept: list[Any] = [n for n, k in zip(numbers, keep, strict=True) if k]
    try:
        numbered: Any = np.array(kept, dtype=np.int64)  # True counts as 1, as a dict key
    except OverflowError:  # an epoch beyond int64
        numbered = pd.Series([int(n) for n in kept], dtype=object)
    return pd.DataFrame({
        "rank": epochs["rank"].to_numpy(dtype=np.int64)[keep],
        "step": epochs["step"].to_numpy(dtype=np.int64)[keep],
        "epoch": numbered,
        "digest": pd.Series([str(d) for d, k in zip(digests, keep, strict=True) if k],
                            dtype=object),
    })  # fmt: skip


def last_orders(orders: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, epoch), the digest of its last event: `rank, epoch, digest` (`orders` as
    `epoch_orders` gives them, in the events' order; `digest` may be any label of the hash)."""
    return orders.drop_duplicates(["rank", "epoch"], keep="last")[["rank", "epoch", "digest"]]
