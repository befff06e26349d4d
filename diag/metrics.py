"""Run metrics from loaded tables: per-rank time breakdown, collectives, memory, expert load.

Pure: no file access. Every definition is in docs/metrics.md. Record times are int64 ns and stay
integers until they are turned into seconds at the end, so nanoseconds are never rounded away.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diag import ledger, pipeline, schema
from diag.intervals import union_length_by
from diag.load import RunData, rank_steps_in

KEYS = ["rank", "step"]
NS_PER_S = 1e9
MEMORY_FIELDS = (*schema.MEMORY_CATEGORIES, "device_peak", "host_rss")
PIPELINE_GROUP = "pp"
DEVICE_TIME_EVENT = "device_time"  # written by diag/kineto/files.py
WARMUP_MIN_STEPS = 3
"""A rank with at least this many step records has its first step excluded as warm-up."""


@dataclass
class RunMetrics:
    """What `compute_metrics` derives from a run; the tables have one row per rank / group."""

    summary: dict[str, Any]
    ranks: pd.DataFrame
    """rank, host, steps, step_time_s, wall_s, busy_s, comm_s, exposed_comm_s, idle_s, fractions;
    stage and bubble_frac (null unless pp > 1, diag.pipeline)."""
    rank_steps: pd.DataFrame
    """One row per analysed (rank, step): wall_s, busy_s, comm_s, exposed_comm_s, idle_s and
    stage_work_s (compute, comm_wait spans and blocking collectives outside the pipeline group:
    the time not lost to the pipeline, the complement of its bubble)."""
    collectives: pd.DataFrame
    memory: pd.DataFrame
    """Per rank, the maximum over steps of each memory field (bytes; null stays null)."""
    memory_steps: pd.DataFrame
    """Every mem record (rank, step, fields), for trends."""
    experts: pd.DataFrame
    memory_peak: pd.DataFrame = field(default_factory=pd.DataFrame)
    """The one peak memory of diag: per rank, the step whose six categories sum highest
    (`rank, step, peak_bytes`, nulls counted as 0), used by the rules, `check` and the
    dashboard. Ranks without a mem record are absent."""
    device: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Profiler traces only: per rank, device time in HTA's terms (diag/kineto/device.py)."""
    findings: list[Any] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def compute_metrics(run: RunData) -> RunMetrics:
    """Derive the metrics of a loaded run (see docs/metrics.md)."""
    skipped: list[str] = []
    windows, warmup_steps = _analysed_steps(run.steps, run.starts_at_warmup)
    _note_orphans(run, skipped)
    rank_steps = run.rank_steps
    if rank_steps is None:
        rank_steps = _time_breakdown(run.spans, run.comms, windows)
    ranks = pipeline.with_stages(_rank_table(rank_steps, run.manifest), run.spans, run.manifest)
    summary = _summary(run, windows, ranks, warmup_steps)
    tp_rows = _tp_vs_ledger(run, windows)
    if tp_rows:
        summary["tp_vs_ledger"] = tp_rows
    return RunMetrics(
        summary=summary,
        ranks=ranks,
        rank_steps=rank_steps,
        collectives=_collectives(run.comms, windows),
        memory=_memory(run.memory),
        memory_steps=run.memory.sort_values(KEYS, kind="stable").reset_index(drop=True),
        memory_peak=memory_peak(run.memory),
        experts=_experts(run.experts, windows),
        device=_device_time(run.events),
        findings=[],
        skipped=skipped,
    )


def step_breakdown(
    steps: pd.DataFrame, spans: pd.DataFrame, comms: pd.DataFrame, warmup: bool = True
) -> pd.DataFrame:
    """The `rank_steps` table of some ranks' records (each (rank, step) on its own, so the
    loader may measure a large run a few ranks at a time and concatenate)."""
    return _time_breakdown(spans, comms, _analysed_steps(steps, warmup)[0])


def _analysed_steps(steps: pd.DataFrame, warmup: bool = True) -> tuple[pd.DataFrame, int]:
    """Step records left after dropping each rank's warm-up step (when the records start at
    the run's start: `warmup`), and the warm-up step count."""
    steps = steps.sort_values(KEYS, kind="stable")
    if not warmup:
        return steps.reset_index(drop=True), 0
    by_rank = steps.groupby("rank")["step"]
    warmup = (by_rank.transform("size") >= WARMUP_MIN_STEPS) & (
        steps["step"] == by_rank.transform("min")
    )
    warmup_steps = int(steps.loc[warmup, "step"].nunique())
    return steps.loc[~warmup].reset_index(drop=True), warmup_steps


def _note_orphans(run: RunData, skipped: list[str]) -> None:
    if run.steps.empty:
        skipped.append("no step records in any rank file: no step could be analysed")
    known = pd.MultiIndex.from_frame(run.steps[KEYS])
    orphans = [
        frame[KEYS][~pd.MultiIndex.from_frame(frame[KEYS]).isin(known)]
        for frame in (run.spans, run.comms)
    ]
    lost = pd.concat(orphans)
    if len(lost):
        skipped.append(
            f"{_file_list(lost['rank'])}: {len(lost)} span/comm records of steps without a step "
            f"record ignored (steps {_short_list(lost['step'])})"
        )


def _file_list(ranks: pd.Series) -> str:
    names = [schema.rank_file_name(int(r)) for r in sorted(ranks.unique())]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _short_list(values: pd.Series) -> str:
    items = [str(int(v)) for v in sorted(values.unique())]
    return ", ".join(items[:5]) + (f", ... ({len(items)} in all)" if len(items) > 5 else "")


def in_steps(frame: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """Which rows of `frame` belong to a (rank, step) of `steps` (a boolean array), with one
    integer key per pair: far cheaper than a merge on millions of records."""
    return rank_steps_in(
        frame["rank"].to_numpy(), frame["step"].to_numpy(),
        steps["rank"].to_numpy(), steps["step"].to_numpy(),
    )  # fmt: skip


def _clipped(frame: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Intervals of analysed steps cut to their rank's step window (empty ones dropped)."""
    merged = frame[[*KEYS, "t0", "t1"]].merge(windows, on=KEYS, how="inner")
    merged["t0"] = np.maximum(merged["t0"], merged["w0"])
    merged["t1"] = np.minimum(merged["t1"], merged["w1"])
    return merged.loc[merged["t1"] > merged["t0"], [*KEYS, "t0", "t1"]]


def _blocking(comms: pd.DataFrame) -> pd.Series:
    """`blocking` where recorded; otherwise blocking unless `async` is true."""
    is_async = comms["async"].where(comms["async"].notna(), False).astype(bool)
    return comms["blocking"].where(comms["blocking"].notna(), ~is_async).astype(bool)


def _time_breakdown(spans: pd.DataFrame, comms: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    windows = steps[[*KEYS, "t0", "t1"]].rename(columns={"t0": "w0", "t1": "w1"})
    compute = _clipped(spans[spans["phase"].isin(schema.COMPUTE_PHASES)], windows)
    comm_waits = _clipped(spans[spans["phase"] == schema.Phase.COMM_WAIT.value], windows)
    blocking = comms[_blocking(comms)]
    in_pipeline = (blocking["group"] == PIPELINE_GROUP).to_numpy(dtype=bool)
    pipeline_waits = _clipped(blocking[in_pipeline], windows)
    own_waits = pd.concat([comm_waits, _clipped(blocking[~in_pipeline], windows)])
    waits = pd.concat([own_waits, pipeline_waits])
    in_flight = union_length_by(_clipped(comms, windows), KEYS)
    exposed = union_length_by(waits, KEYS)
    compute_or_wait = union_length_by(pd.concat([compute, waits]), KEYS)
    stage_work = union_length_by(pd.concat([compute, own_waits]), KEYS)
    out = windows[KEYS].copy()
    out["wall_ns"] = windows["w1"] - windows["w0"]
    measures = (
        ("comm", in_flight), ("exposed", exposed), ("either", compute_or_wait),
        ("stage_work", stage_work),
    )  # fmt: skip
    for name, measure in measures:
        joined = out.join(measure.rename(name), on=KEYS)[name]
        out[name] = joined.fillna(0).astype("int64")
    busy_ns = out["either"] - out["exposed"]
    idle_ns = (out["wall_ns"] - busy_ns - out["exposed"]).clip(lower=0)
    return pd.DataFrame({
        "rank": out["rank"],
        "step": out["step"],
        "wall_s": out["wall_ns"] / NS_PER_S,
        "busy_s": busy_ns / NS_PER_S,
        "comm_s": out["comm"] / NS_PER_S,
        "exposed_comm_s": out["exposed"] / NS_PER_S,
        "idle_s": idle_ns / NS_PER_S,
        "stage_work_s": out["stage_work"] / NS_PER_S,
    })  # fmt: skip


def _rank_table(rank_steps: pd.DataFrame, manifest: schema.Manifest) -> pd.DataFrame:
    hosts = {info.rank: info.host for info in manifest.ranks}
    by_rank = rank_steps.groupby("rank")
    totals = by_rank[
        ["wall_s", "busy_s", "comm_s", "exposed_comm_s", "idle_s", "stage_work_s"]
    ].sum()
    table = pd.DataFrame({
        "rank": totals.index.astype("int64"),
        "host": [hosts.get(int(r)) for r in totals.index],
        "steps": by_rank.size().to_numpy(),
        "step_time_s": by_rank["wall_s"].mean().to_numpy(),
    })  # fmt: skip
    for name in totals.columns:
        table[name] = totals[name].to_numpy()
    wall = table["wall_s"].where(table["wall_s"] > 0)
    table["busy_frac"] = table["busy_s"] / wall
    table["comm_share"] = table["comm_s"] / wall
    table["exposed_comm_share"] = table["exposed_comm_s"] / wall
    table["idle_frac"] = table["idle_s"] / wall
    return table


def _summary(
    run: RunData, steps: pd.DataFrame, ranks: pd.DataFrame, warmup_steps: int
) -> dict[str, Any]:
    layout = run.manifest.layout
    tp, pp = layout.tp or 1, layout.pp or 1
    per_step = steps.groupby("step").agg(t0=("t0", "min"), t1=("t1", "max"))
    step_walls_s = (per_step["t1"] - per_step["t0"]) / NS_PER_S
    total_wall_s = float(step_walls_s.sum())
    tokens = steps["tokens"].sum(min_count=1)
    wall_sum = ranks["wall_s"].sum()
    busy_mean = ranks["busy_s"].mean()
    pipeline_metrics = pipeline.pipeline_summary(ranks)
    summary: dict[str, Any] = {
        "step_time_s": float(step_walls_s.median()) if len(step_walls_s) else None,
        "tokens_per_s": (
            float(tokens) / (tp * pp) / total_wall_s
            if pd.notna(tokens) and total_wall_s > 0
            else None
        ),
        "comm_share": _ratio(ranks["comm_s"].sum(), wall_sum),
        "exposed_comm_share": _ratio(ranks["exposed_comm_s"].sum(), wall_sum),
        "hidden_comm_share": _hidden(ranks),
        "busy_imbalance": _ratio(ranks["busy_s"].max(), busy_mean),
        "bubble_theory": (
            ledger.bubble_fraction(pp, layout.microbatches or 1, layout.virtual_stages or 1)
            if pp > 1
            else None
        ),
        "bubble_fraction": pipeline_metrics["bubble_fraction"] if pp > 1 else None,
        "steps_analysed": int(per_step.shape[0]),
        "ranks_analysed": int(ranks.shape[0]),
        "world_size": run.manifest.world_size,
        "warmup_steps_excluded": warmup_steps,
        "loss_last": _last_loss(steps),
    }
    if pp > 1:  # pipeline runs only (docs/metrics.md, "Pipeline")
        summary["stage_imbalance"] = pipeline_metrics["stage_imbalance"]
    return summary


def _hidden(ranks: pd.DataFrame) -> float | None:
    """Share of the time collectives are in flight that overlaps compute (not exposed)."""
    comm_s = ranks["comm_s"].sum()
    hidden = _ratio(comm_s - ranks["exposed_comm_s"].sum(), comm_s)
    return None if hidden is None else min(max(hidden, 0.0), 1.0)


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if pd.isna(numerator) or pd.isna(denominator) or denominator == 0:
        return None
    return float(numerator) / float(denominator)


def _last_loss(steps: pd.DataFrame) -> float | None:
    finite = steps[np.isfinite(steps["loss"])]
    if finite.empty:
        return None
    last = finite.sort_values(KEYS, kind="stable").groupby("rank")["loss"].last()
    return float(last.mean())


COLLECTIVE_KEYS = ["op", "group", "tag"]


def _collectives(comms: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    columns = [
        *COLLECTIVE_KEYS, "count", "bytes", "bytes_per_step", "expected_bytes", "ratio",
        "time_s", "group_size", "busbw_GBps",
    ]  # fmt: skip
    records = comms.merge(steps[KEYS], on=KEYS, how="inner")
    if records.empty:
        return pd.DataFrame(columns=columns)
    records["duration_ns"] = records["t1"] - records["t0"]
    records["has_expected"] = records["expected_bytes"].notna()
    per_rank = records.groupby([*COLLECTIVE_KEYS, "rank"], dropna=False).agg(
        count=("op", "size"),
        bytes=("bytes", "sum"),
        measured=("bytes", "count"),  # profiler traces may not say (DeepEP, gloo)
        expected_bytes=("expected_bytes", "sum"),
        has_expected=("has_expected", "any"),
        duration_ns=("duration_ns", "sum"),
    )
    steps_per_rank = steps.groupby("rank").size()
    rank_steps = steps_per_rank.reindex(per_rank.index.get_level_values("rank")).to_numpy()
    per_rank["bytes"] = per_rank["bytes"].where(per_rank["measured"] > 0)
    per_rank["bytes_per_step"] = per_rank["bytes"] / rank_steps
    per_rank["expected_bytes"] = per_rank["expected_bytes"].where(per_rank["has_expected"])
    table = per_rank.groupby(level=COLLECTIVE_KEYS, dropna=False, sort=False).mean()
    table = table.join(
        records.groupby(COLLECTIVE_KEYS, dropna=False, sort=False).agg(
            group_size=("group_size", "median"),
            all_bytes=("bytes", "sum"),
            all_ns=("duration_ns", "sum"),
        )
    ).reset_index()
    table["tag"] = table["tag"].astype(object).where(table["tag"].notna(), None)
    table["ratio"] = table["bytes"] / table["expected_bytes"].where(table["expected_bytes"] > 0)
    table["time_s"] = table["duration_ns"] / NS_PER_S
    sizes = [None if pd.isna(n) or n < 1 else int(n) for n in table["group_size"]]
    table["group_size"] = pd.Series(sizes, index=table.index, dtype=object)
    table["busbw_GBps"] = [
        total / (ns / NS_PER_S) * ledger.bus_factor(str(op), n) / 1e9 if ns > 0 and n else None
        for op, n, total, ns in zip(
            table["op"], sizes, table["all_bytes"], table["all_ns"], strict=True
        )
    ]
    table = table.sort_values("time_s", ascending=False, kind="stable")
    return table[columns].reset_index(drop=True)


TP_LAYER_TAG = r"^tp\.(?:attn|mlp)\.(fwd|bwd)$"
"""Tags of the per-layer TP collectives (reference_runs/tp_comms.py); the group is `tp`."""


def _tp_vs_ledger(run: RunData, steps: pd.DataFrame) -> list[dict[str, Any]] | None:
    """Per op and direction, the per-layer TP collectives per rank and step against the ledger's
    2 x layers x microbatches of `micro_batch x seq x hidden x dtype` bytes each (sequence
    parallel: as many reduce-scatters and all-gathers). None without such collectives."""
    comms = run.comms.loc[run.comms["group"] == "tp", [*KEYS, "op", "tag", "bytes"]]
    codes, tags = pd.factorize(comms["tag"])  # the regex runs once per distinct tag
    ways = [m.group(1) if (m := re.match(TP_LAYER_TAG, str(t))) else None for t in tags]
    direction = np.array([*ways, None], dtype=object)[codes]  # code -1 (null tag) -> None
    keep = pd.notna(direction) & in_steps(comms, steps)
    records = comms.loc[keep, ["op", "bytes"]].assign(direction=direction[keep])
    model, layout = run.manifest.model, run.manifest.layout
    if records.empty or not model.layers or steps.empty:
        return None
    theory = ledger.tp_allreduce_count(model.layers, layout.microbatches or 1)
    try:
        payload = ledger.tp_allreduce_bytes(
            model.micro_batch or 0, model.seq_len or 0, model.hidden or 0,
            ledger.dtype_bytes(model.dtype or "float32"),
        )  # fmt: skip
    except ValueError:
        payload = 0
    rank_steps = len(steps)
    rows = []
    groups = records.groupby(["op", "direction"])
    for (op, way), group in sorted(groups, key=lambda item: (item[0][0], item[0][1] != "fwd")):
        # a rank holds layers / pp of the model (its stage's): the ledger counts per rank
        count = (theory.forward if way == "fwd" else theory.backward) / (layout.pp or 1)
        measured = float(group["bytes"].sum()) / rank_steps
        expected = count * payload if payload else None
        rows.append({
            "op": op,
            "direction": way,
            "count_per_step": len(group) / rank_steps,
            "ledger_count_per_step": count,
            "bytes_per_step": measured,
            "ledger_bytes_per_step": expected,
            "ratio": measured / expected if expected else None,
        })  # fmt: skip
    return rows


def _device_time(events: pd.DataFrame) -> pd.DataFrame:
    rows = events[events["name"] == DEVICE_TIME_EVENT]
    columns = ["rank", "kernel_time_s", "idle_share", "compute_share", "non_compute_share",
               "comm_s", "comm_overlap"]  # fmt: skip
    table = []
    for rank, fields in zip(rows["rank"], rows["fields"], strict=True):
        kernel_us = fields.get("kernel_time_us") or float("nan")
        table.append({
            "rank": int(rank),
            "kernel_time_s": kernel_us / 1e6,
            "idle_share": fields.get("idle_us", 0) / kernel_us,
            "compute_share": fields.get("compute_us", 0) / kernel_us,
            "non_compute_share": fields.get("non_compute_us", 0) / kernel_us,
            "comm_s": fields.get("comm_us", 0) / 1e6,
            "comm_overlap": fields.get("overlap"),
        })  # fmt: skip
    return pd.DataFrame(table, columns=columns).sort_values("rank").reset_index(drop=True)


def _memory(memory: pd.DataFrame) -> pd.DataFrame:
    table = memory.groupby("rank")[list(MEMORY_FIELDS)].max()
    return table.reset_index()[["rank", *MEMORY_FIELDS]]


def memory_peak(memory: pd.DataFrame) -> pd.DataFrame:
    """Per rank, the step whose six memory categories sum highest (the first such step on a
    tie) and that sum: `rank, step, peak_bytes`."""
    columns = ["rank", "step", "peak_bytes"]
    if memory.empty:
        return pd.DataFrame(columns=columns)
    total = memory[list(schema.MEMORY_CATEGORIES)].astype("float64").fillna(0.0).sum(axis=1)
    frame = pd.DataFrame({"rank": memory["rank"], "step": memory["step"], "peak_bytes": total})
    frame = frame.sort_values(["rank", "step"], kind="stable")
    first_highest = frame.groupby("rank", sort=True)["peak_bytes"].idxmax()
    return frame.loc[first_highest, columns].reset_index(drop=True)


def _experts(experts: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
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
        per_expert, max_over_mean, drop_rate = _expert_load(group, width)
        mean = float(per_expert.mean())
        first = _expert_load(group[group["step"] == group["step"].min()], width)
        last = _expert_load(group[group["step"] == group["step"].max()], width)
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


def _expert_load(
    records: pd.DataFrame, width: int
) -> tuple[np.ndarray, float | None, float | None]:
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
