"""The attribution of many steps in bounded memory: the analysed steps split into chunks whose
replay stays near CHUNK_EVENTS events, each chunk's records read when its turn comes (a large
run's from its rank files, diag/read/record_spill.py) and dropped after, and the chunks'
attributions combined into one (docs/metrics.md, "Attribution", "Every step, in chunks").

Combining: every time per step is the mean over the replayed steps, each chunk weighted by
its steps (exact for the measured, replayed and ideal steps); the replay error is the median
over every replayed step's error. A cause is one counterfactual (kind, ranks, stage, group);
its cost is its saving per step over all replayed steps, counting nothing in the chunks where
it was not found (its saving there was none, or the rank was not among the largest excesses);
its evidence describes the chunks where it was found, each weighted by its steps
(`found_in_steps` says how many of `steps_replayed` those are).
"""

from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from diag.numeric.keys import in_steps, whole_steps
from diag.read.load import RunData
from diag.read.parallel import workers
from diag.read.record_spill import SpilledRecords
from diag.whatif import timeline as tl
from diag.whatif.causes import (
    NS_PER_S,
    Attribution,
    Cause,
    CauseKind,
    imbalance_explained,
    straggler_explained,
)

CHUNK_EVENTS = 150_000
"""Events replayed at once, about (a chunk is never below two steps): the attribution replays
a chunk a few dozen times, and its timeline is built in pandas."""
DEFAULT_REPLAY_EVENTS = 1_000_000
"""By default every analysed step whose records are in memory is replayed, in chunks, while
they are at most this many events (a few seconds); beyond, the first chunk only, and a note
names `--replay all` (every analysed step, the rank files read again in chunks)."""
MEMO_NAME = "replay_memo"
"""A growing run's ReplayMemo, by this name in `LiveRun.derived()`."""
PARALLEL_MAX_CHUNK_EVENTS = 2_000_000
"""Chunks at most this large are replayed by one worker process per core (each holds its own
chunk: a 1,024-rank 3D run's two steps, 570k events); larger ones one after the other, so that
memory holds one (16,384 ranks: 9 M events)."""


@dataclass
class Plan:
    """The chunks of steps to replay (step numbers, ascending) and what a note says of them."""

    chunks: list[np.ndarray]
    notes: list[str]
    chunk_events: float = 0.0
    """About how many events the largest chunk replays."""


@dataclass
class Part:
    """One chunk's attribution and the relative replay error of each of its replayed steps."""

    attribution: Attribution
    errors: np.ndarray


def plan(run: RunData, steps: pd.DataFrame, replay_all: bool) -> Plan:
    """Chunks of the analysed `steps` near CHUNK_EVENTS events each: every step with
    `replay_all`; by default those whose records are in memory, all of them when they are
    within DEFAULT_REPLAY_EVENTS, else the first chunk."""
    kept = whole_steps(steps, run.span_steps)
    comms, spans = in_steps(run.comms, kept).sum(), in_steps(run.spans, kept).sum()
    per_step = (comms + spans / 4 + 2 * len(kept)) / max(len(kept), 1)  # per rank and step
    ranks = steps["rank"].nunique()
    keep = max(2, int(CHUNK_EVENTS / max(per_step * ranks, 1)))
    order = np.sort((steps if replay_all else kept)["step"].unique())
    if len(order) <= keep:
        chosen = [order]
    elif replay_all or per_step * ranks * len(order) <= DEFAULT_REPLAY_EVENTS:
        chosen = _blocks(order, keep)
    else:
        chosen = [order[:keep]]
    replayed, analysed = sum(len(c) for c in chosen), steps["step"].nunique()
    notes = [] if replayed == analysed else [
        f"attribution replays the first {replayed} of {analysed} analysed steps "
        "(`diag analyze --replay all`: every step)"
    ]  # fmt: skip
    return Plan(chosen, notes, per_step * ranks * len(chosen[0]))


def _blocks(order: np.ndarray, keep: int) -> list[np.ndarray]:
    """`order` in blocks of `keep` steps from the first, a last block below two steps joined to
    the one before: a step's chunk does not move as a live run grows, so the live views replay
    only the chunks that changed (ReplayMemo)."""
    blocks = [order[at : at + keep] for at in range(0, len(order), keep)]
    if len(blocks) > 1 and len(blocks[-1]) < 2:
        blocks[-2:] = [np.concatenate(blocks[-2:])]
    return blocks


class ReplayMemo:
    """Chunk attributions already made, for a run that grows (`LiveRun`): a chunk's replay
    depends on its steps' rows and records, their host time and the manifest, none of which a
    finished step changes, so it is kept under a digest of those and not replayed again."""

    def __init__(self, size: int = 256) -> None:
        self._parts: dict[bytes, Part | None] = {}
        self.size = size
        self.hits = 0

    @staticmethod
    def keys(
        run: RunData, steps: pd.DataFrame, host: pd.DataFrame, chunks: list[np.ndarray]
    ) -> list[bytes]:
        """For each chunk, a digest of what its attribution is computed from."""
        manifest = repr(run.manifest).encode()
        records = [  # per step, in memory (a large run's spilled chunks count none)
            pd.Series(frame["step"].to_numpy()).value_counts() for frame in (run.spans, run.comms)
        ]
        keys = []
        for chunk in chunks:
            digest = hashlib.blake2b(np.ascontiguousarray(chunk, dtype=np.int64).tobytes())
            digest.update(manifest)
            for frame in (steps, host):
                rows = frame[frame["step"].isin(chunk)] if "step" in frame.columns else frame
                for name in rows.columns:
                    digest.update(str(name).encode())
                    hashed = pd.util.hash_pandas_object(rows[name], index=False)
                    digest.update(hashed.to_numpy().tobytes())
            for counts in records:
                counted = int(counts.reindex(chunk, fill_value=0).sum())
                digest.update(counted.to_bytes(8, "little"))
            keys.append(digest.digest())
        return keys

    def replayed(
        self, run: RunData, steps: pd.DataFrame, host: pd.DataFrame, plan: Plan, replay: Replay
    ) -> list[Part | None]:
        """`replayed` of the plan's chunks (`replay` reads `host`), those replayed before taken
        from the memo."""
        keys = self.keys(run, steps, host, plan.chunks)
        found = {key: self._parts[key] for key in keys if key in self._parts}
        self.hits += len(found)
        todo = [i for i, key in enumerate(keys) if key not in found]
        if todo:
            fresh = replayed(run, steps, [plan.chunks[i] for i in todo], replay, plan.chunk_events)
            for i, part in zip(todo, fresh, strict=True):
                found[keys[i]] = part
                if len(self._parts) >= self.size:
                    self._parts.pop(next(iter(self._parts)))  # the oldest
                self._parts[keys[i]] = part
        return [found[key] for key in keys]


@contextmanager
def chunk_runs(run: RunData, chunks: list[np.ndarray]) -> Iterator[Callable[[int], RunData]]:
    """Within the block, chunk i's run: `run` itself where its records are in memory, else
    `run` with the spans and collectives of chunk i's steps read from its rank files (every
    such chunk written to a scratch folder in one pass on entering, removed on leaving)."""
    below = run.span_steps
    spilled = [i for i, c in enumerate(chunks) if below is not None and len(c) and c[-1] >= below]
    if not spilled:
        yield lambda _index: run
        return
    bounds = [range(int(chunks[i][0]), int(chunks[i][-1]) + 1) for i in spilled]
    columns = {"span": tl.SPANS_COLUMNS, "comm": tl.COMMS_COLUMNS}
    with SpilledRecords(run, bounds, columns) as records:

        def run_of(index: int) -> RunData:
            if index not in spilled:
                return run
            spans, comms = records.chunk(spilled.index(index))
            return dataclasses.replace(run, spans=spans, comms=comms, span_steps=None)

        yield run_of


Replay = Callable[[RunData, RunData, pd.DataFrame], Part | None]
"""A chunk's attribution from (the run, the run holding the chunk's records, its steps)."""
_job: tuple[Replay, RunData, Callable[[int], RunData], pd.DataFrame, list[np.ndarray]] | None
_job = None
"""What the forked workers replay (`replayed`): set before they fork, inherited."""


def replayed(
    run: RunData, steps: pd.DataFrame, chunks: list[np.ndarray], replay: Replay, events: float
) -> list[Part | None]:
    """Each chunk's attribution (None: nothing to replay), in order, by `replay`: the first
    here (its compiled loops loaded before any fork), the others by one forked worker process
    per core when there are several and each chunk is at most PARALLEL_MAX_CHUNK_EVENTS
    (`events`: about a chunk's)."""
    global _job
    with chunk_runs(run, chunks) as run_of:
        first = _replay_chunk(replay, run, run_of, steps, chunks, 0)
        count = min(workers(), len(chunks) - 1)
        methods = multiprocessing.get_all_start_methods()
        rest: list[Part | None] | None = None
        if count >= 2 and events <= PARALLEL_MAX_CHUNK_EVENTS and "fork" in methods:
            _job = (replay, run, run_of, steps, chunks)
            try:
                with multiprocessing.get_context("fork").Pool(count) as pool:
                    rest = pool.map(_replay_in_worker, range(1, len(chunks)), chunksize=1)
            except OSError:  # no processes to be had (limits, a sandbox): here, one by one
                rest = None
            finally:
                _job = None
        if rest is None:
            rest = [_replay_chunk(replay, run, run_of, steps, chunks, i)
                    for i in range(1, len(chunks))]  # fmt: skip
    return [first, *rest]


def _replay_in_worker(index: int) -> Part | None:
    assert _job is not None
    return _replay_chunk(*_job, index)


def _replay_chunk(
    replay: Replay,
    run: RunData,
    run_of: Callable[[int], RunData],
    steps: pd.DataFrame,
    chunks: list[np.ndarray],
    index: int,
) -> Part | None:
    """Chunk `index`'s attribution: `replay` of its records and its steps' rows."""
    return replay(run, run_of(index), steps[steps["step"].isin(chunks[index])])


def combined(parts: list[Part], notes: list[str]) -> Attribution:
    """One attribution of the chunks' (module docstring)."""
    weights = np.array([p.attribution.steps_replayed for p in parts], dtype=np.float64)
    total = float(weights.sum())

    def mean(name: str) -> float:
        values = np.array([getattr(p.attribution, name) for p in parts], dtype=np.float64)
        return float((values * weights).sum() / total)

    replayed = mean("replayed_step_s")
    seen: list[str] = []
    for note in notes + [n for p in parts for n in p.attribution.notes]:
        if note not in seen:
            seen.append(note)
    return Attribution(
        measured_step_s=mean("measured_step_s"),
        replayed_step_s=replayed,
        replay_error=float(np.median(np.concatenate([p.errors for p in parts]))),
        steps_replayed=int(total),
        causes=_causes(parts, weights, replayed),
        ideal_step_s=mean("ideal_step_s"),
        all_transfers_s=mean("all_transfers_s"),
        transfers_if_untraced_waited_s=_low_end(parts, weights),
        untraced_unsure_ranks=_unsure_ranks(parts),
        balanced_s=mean("balanced_s"),
        waits=_per_step(
            parts, weights, "waits", ["rank", "group"], ["skew_s", "transfer_s"], ["last_share"]
        ),
        notes=seen,
        gaps=_per_step(parts, weights, "gaps", ["rank"], ["waiting_s", "own_s"], []),
        ambiguous=_per_step(parts, weights, "ambiguous", ["rank", "before"], ["gap_s"], []),
        alternative=_alternative(parts, notes),
    )


def _unsure_ranks(parts: list[Part]) -> list[int]:
    return sorted({r for part in parts for r in part.attribution.untraced_unsure_ranks})


def _low_end(parts: list[Part], weights: np.ndarray) -> float | None:
    """The chunks' `transfers_if_untraced_waited_s`, a chunk without one at its whole
    transfers' saving; None where no chunk has one."""
    lows = [p.attribution.transfers_if_untraced_waited_s for p in parts]
    if all(low is None for low in lows):
        return None
    values = [p.attribution.all_transfers_s if low is None else low
              for p, low in zip(parts, lows, strict=True)]  # fmt: skip
    return float((np.array(values) * weights).sum() / float(weights.sum()))


def _alternative(parts: list[Part], notes: list[str]) -> Attribution | None:
    """The chunks' other reading combined (a chunk without ambiguous gaps reads the same
    either way: its own attribution stands for it); None where no chunk has one."""
    if all(p.attribution.alternative is None for p in parts):
        return None
    return combined([Part(p.attribution.alternative or p.attribution, p.errors)
                     for p in parts], notes)  # fmt: skip


def _causes(parts: list[Part], weights: np.ndarray, replayed_s: float) -> list[Cause]:
    found: dict[tuple[Any, ...], list[tuple[Cause, float]]] = {}
    for part, weight in zip(parts, weights, strict=True):
        for cause in part.attribution.causes:
            key = (cause.kind, cause.label, tuple(cause.ranks), cause.stage, cause.group)
            found.setdefault(key, []).append((cause, float(weight)))
    total = float(weights.sum())
    causes = []
    for kind, label, ranks, stage, group in found:
        pairs = found[(kind, label, ranks, stage, group)]
        cost = sum(c.cost_s * w for c, w in pairs) / total
        share = cost / replayed_s if replayed_s > 0 else 0.0
        steps = sum(w for _, w in pairs)  # the steps of the chunks where it was found
        evidence = _evidence(pairs, steps) | {"found_in_steps": int(steps)}
        causes.append(Cause(kind, label, cost, share, list(ranks), stage, group, evidence))
    return sorted(causes, key=lambda c: -c.cost_s)


def _evidence(pairs: list[tuple[Cause, float]], weight: float) -> dict[str, Any]:
    """The evidence of the chunks where a cause was found (`weight`: their steps): numbers
    weighted by their steps, words rebuilt from those numbers."""
    first = pairs[0][0]
    evidence: dict[str, Any] = {}
    for name, value in first.evidence.items():
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        evidence[name] = (
            sum(float(c.evidence.get(name, 0.0)) * w for c, w in pairs) / weight
            if numeric
            else value
        )
    if first.kind in (CauseKind.STRAGGLER, CauseKind.HOST):
        excess, saved = evidence["typical_excess_per_step_s"], evidence["reaching_step_end_s"]
        evidence["absorbed_per_step_s"] = max(excess - saved, 0.0)
        queued = float(evidence.get("queued_excess_per_step_s") or 0.0)
        evidence["explained"] = straggler_explained(
            excess * NS_PER_S, saved * NS_PER_S, queued * NS_PER_S
        )
    elif first.kind == CauseKind.IMBALANCE:
        random_s = sum(c.cost_s * w for c, w in pairs) / weight
        noise_s = evidence["if_noise_saves_s"]
        evidence["explained"] = imbalance_explained(random_s * NS_PER_S, noise_s * NS_PER_S)
    return evidence


def _per_step(
    parts: list[Part],
    weights: np.ndarray,
    table: str,
    keys: list[str],
    per_step: list[str],
    shares: list[str],
) -> pd.DataFrame:
    """A table of per-step figures by `keys` over every replayed step (a key absent from a
    chunk had none there); `shares` weighted over the chunks where the key is."""
    frames = []
    for part, weight in zip(parts, weights, strict=True):
        frame = getattr(part.attribution, table)
        if frame.empty:
            continue
        frame = frame[keys + per_step + shares].copy()
        for name in per_step + shares:
            frame[name] = frame[name].astype(np.float64) * weight
        frame["weight"] = weight
        frames.append(frame)
    if not frames:
        return getattr(parts[0].attribution, table)
    summed = pd.concat(frames, ignore_index=True).groupby(keys, as_index=False, sort=True).sum()
    for name in per_step:
        summed[name] = summed[name] / float(weights.sum())
    for name in shares:
        summed[name] = summed[name] / summed["weight"]
    return summed.drop(columns="weight")
