"""The sample order of each epoch, per rank (the `epoch` events' `order_hash`), which PIT001
(`pitfalls.set_epoch`) compares across epochs. Read here from the events' fields once, so that a
growing run (`diag.LiveRun`) reads each step's events as it takes the step in and keeps the rows,
not every event again after every step."""

from __future__ import annotations

import pandas as pd

ORDER_COLUMNS = ["rank", "step", "epoch", "digest"]
DERIVED_NAME = "epoch_orders"
"""The name of `last_orders` in a rule context's derived values (`RuleContext.derived`)."""


def epoch_orders(events: pd.DataFrame) -> pd.DataFrame:
    """One row per `epoch` event whose epoch is an integer and that carries an order hash:
    `rank, step, epoch` (an integer; True counts as 1) and `digest` (the hash as a string), in
    the events' order."""
    if events.empty or "fields" not in events:
        return pd.DataFrame({name: pd.Series(dtype="int64") for name in ORDER_COLUMNS[:3]}
                            | {"digest": pd.Series(dtype=object)})  # fmt: skip
    epochs = events[events["name"] == "epoch"]
    ranks, steps = epochs["rank"].tolist(), epochs["step"].tolist()
    rows = [
        (rank, step, int(epoch), str(digest))
        for rank, step, fields in zip(ranks, steps, epochs["fields"].tolist(), strict=True)
        if fields
        and isinstance(epoch := fields.get("epoch"), int)
        and (digest := fields.get("order_hash")) is not None
    ]
    if not rows:
        return epoch_orders(events.iloc[:0].drop(columns="fields"))
    return pd.DataFrame(rows, columns=ORDER_COLUMNS).astype({"rank": "int64", "step": "int64"})


def last_orders(orders: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, epoch), the digest of its last event: `rank, epoch, digest` (`orders` as
    `epoch_orders` gives them, in the events' order; `digest` may be any label of the hash)."""
    return orders.drop_duplicates(["rank", "epoch"], keep="last")[["rank", "epoch", "digest"]]
