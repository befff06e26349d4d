"""Expert load of MoE layers: tokens per expert, their spread, drops and dead experts, first
and last step (docs/metrics.md, "Experts")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.metrics.common import KEYS


def layer_label(value: object) -> int | str:
    """A MoE layer's label as the records gave it: an integer index, or a name (the run
    format allows both)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    return str(value)


def expert_load(experts: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    columns = [
        "layer", "experts", "tokens", "load_cv", "max_over_mean", "drop_rate", "dead_experts",
        "steps", "tokens_per_expert", "max_over_mean_first", "max_over_mean_last",
        "drop_rate_first", "drop_rate_last",
    ]  # fmt: skip
    records = experts.merge(steps[KEYS], on=KEYS, how="inner")
    rows = []
    for layer, group in records.groupby("layer", sort=True):
        width = max(len(t) for t in group["tokens"])
        if width == 0:
            continue
        per_expert, max_over_mean, drop_rate = _load_of(group, width)
        mean = float(per_expert.mean())
        first = _load_of(group[group["step"] == group["step"].min()], width)
        last = _load_of(group[group["step"] == group["step"].max()], width)
        rows.append({
            "layer": layer,
            "experts": width,
            "tokens": float(per_expert.sum()),
            "load_cv": float(per_expert.std()) / mean if mean > 0 else None,
            "max_over_mean": max_over_mean,
            "drop_rate": drop_rate,
            "dead_experts": int((per_expert == 0).sum()),
            "steps": int(group["step"].nunique()),
            "tokens_per_expert": per_expert.tolist(),
            "max_over_mean_first": first[1],
            "max_over_mean_last": last[1],
            "drop_rate_first": first[2],
            "drop_rate_last": last[2],
        })  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def _load_of(records: pd.DataFrame, width: int) -> tuple[np.ndarray, float | None, float | None]:
    """Tokens per expert summed over `records`, their max over mean, and the drop rate."""
    per_expert = np.zeros(width)
    for tokens in records["tokens"]:
        per_expert[: len(tokens)] += tokens
    total = float(per_expert.sum())
    mean = total / width
    dropped = records["dropped"].sum(min_count=1)
    return (
        per_expert,
        float(per_expert.max()) / mean if mean > 0 else None,
        float(dropped) / total if pd.notna(dropped) and total > 0 else None,
    )
