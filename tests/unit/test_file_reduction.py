"""A large run's workers reduce each rank file from its packed columns
(`diag.metrics.file_reduction`); what they get is what the metrics compute from the loaded
tables (`time_breakdown`, `comm_totals`), to the bit, for simulated runs of every kind of
parallelism in both formats and for hand-written records with nulls, repeats and orphans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from diag.contract.schema import rank_file_name
from diag.metrics.comm_totals import comm_totals
from diag.metrics.common import analysed_steps
from diag.metrics.file_reduction import reduce_rank_files
from diag.metrics.time_breakdown import time_breakdown
from diag.rankfile.rank_file import read_rank_file
from diag.rankfile.records import concat, unpack
from diag.read.load import load_run
from simulator import ModelSpec, SimConfig, simulate

SMALL = {"layers": 8, "hidden": 256, "heads": 8, "seq_len": 512, "vocab": 4096}
LAYOUTS = {
    "3d": {"dp": 2, "tp": 2, "pp": 2, "microbatches": 4},
    "interleaved": {"pp": 4, "microbatches": 8, "virtual_stages": 2, "schedule": "interleaved"},
    "moe": {"dp": 2, "ep": 2, "model": {"experts": 4}},
    "zero3": {"dp": 4, "zero_stage": 3, "inject": ("straggler:rank=1,ms=5",)},
}


def _both_ways(run_dir: Path, warmup: bool = True) -> tuple[dict[str, pd.DataFrame], ...]:
    """(from the tables, from the files) for one run directory."""
    run = load_run(run_dir)
    tables = {
        "rank_steps": time_breakdown(run.spans, run.comms, analysed_steps(run.steps, warmup)[0]),
        "comm_totals": comm_totals(run.comms),
    }
    files = [
        read_rank_file(rank, run_dir / rank_file_name(rank, run.rank_file_suffix)).columns
        for rank in range(run.manifest.world_size)
    ]
    return tables, reduce_rank_files(files, warmup)


def _assert_same(tables: dict[str, pd.DataFrame], files: dict[str, pd.DataFrame]) -> None:
    for name, expected in tables.items():
        pd.testing.assert_frame_equal(files[name], expected, check_exact=True, obj=name)


@pytest.mark.parametrize("rank_format", ["arrow", "jsonl"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_simulated_runs_reduce_to_the_tables_numbers(
    tmp_path: Path, layout: str, rank_format: str
) -> None:
    options: dict[str, Any] = {"steps": 5, **LAYOUTS[layout]}
    model = ModelSpec(**{**SMALL, **options.pop("model", {})})
    result = simulate(SimConfig(model=model, **options), tmp_path / "run", format=rank_format)
    tables, files = _both_ways(result.path)
    assert len(tables["rank_steps"]) and len(tables["comm_totals"])
    _assert_same(tables, files)


def test_odd_records_reduce_to_the_tables_numbers(runs) -> None:
    """Nulls in every key, async and blocking flags set either way or not at all, a step
    recorded twice, records of a step without a step record, spans out of time order."""
    rows: dict[int, list[dict[str, Any] | str]] = {}
    for rank in range(2):
        rows[rank] = [
            runs.step(0, 0, 100), runs.step(1, 100, 200), runs.step(1, 100, 230),
            runs.step(2, 230, 330), runs.step(3, 330, 430),
            runs.span(1, "bwd", 150, 190), runs.span(1, "fwd", 100, 160),
            runs.span(1, "comm_wait", 185, 200), runs.span(2, "opt", 300, 340),
            runs.span(3, "fwd", 330, 400), runs.span(9, "fwd", 900, 910),
            runs.comm(1, 170, 195, group="pp", op="send", bytes=None),
            runs.comm(1, 160, 180, **{"async": True}),
            runs.comm(2, 240, 260, blocking=False, group=None, group_size=None),
            runs.comm(2, 250, 300, blocking=True, **{"async": True}, tag="grads"),
            runs.comm(3, 340, 350 + 10 * rank, expected_bytes=512, dtype="bf16"),
            runs.comm(9, 900, 905),
        ]  # fmt: skip
    run_dir = runs.write(rows, runs.manifest(2))
    for warmup in (True, False):
        tables, files = _both_ways(run_dir, warmup)
        _assert_same(tables, files)


def test_files_read_line_by_line_reduce_to_the_tables_numbers(runs) -> None:
    """A rank file with a line the typed decoder refuses (a NaN loss) is read line by line,
    its numbers packed as labels: the reduction reads them as the tables do (a string that
    is a number, an infinity, a list where a number belongs, a list or a dict for a flag)."""
    rows: dict[int, list[dict[str, Any] | str]] = {}
    for rank in range(2):
        rows[rank] = [
            '{"kind":"step","step":0,"t0":0,"t1":100000000,"tokens":1,"loss":NaN}',
            runs.step(1, 100, 200), runs.step(2, 200, 300), runs.step(3, 300, 400),
            runs.span(1, "fwd", 100, 150), runs.span(2, "bwd", 200, 280),
            runs.comm(1, 150, 190, bytes="4096", group_size="2"),
            runs.comm(2, 280, 295, bytes=[1, 2], expected_bytes=512, blocking={"a": 1}),
            runs.comm(2, 282, 290, **{"async": [1]}),
            '{"kind":"comm","step":3,"op":"all_reduce","group":"dp","group_size":2,'
            '"bytes":Infinity,"t0":350000000,"t1":360000000}',
            runs.comm(3, 360, 390 + rank, bytes=1000 * (rank + 1)),
        ]  # fmt: skip
    run_dir = runs.write(rows, runs.manifest(2))
    tables, files = _both_ways(run_dir)
    assert len(tables["comm_totals"])
    _assert_same(tables, files)


def test_a_chunk_of_no_files_prepares_the_compiled_loop() -> None:
    assert reduce_rank_files([]) == {}


@pytest.mark.parametrize("consecutive", [True, False])
def test_the_compiled_union_loop_gives_what_the_python_loop_gives(consecutive: bool) -> None:
    """Large inputs run `union_lengths_in_windows`' loop compiled (diag/numeric/compiled.py), small
    ones as Python; the same code, so the same sums, and both the measure of each union of the
    intervals cut to their window, in any order, whether the windows' keys are consecutive (a rank's
    steps: an offset finds the window) or not (a binary search)."""
    from diag.numeric import compiled, intervals

    rng = np.random.default_rng(7)
    count, windows = 3_000, 40
    window_keys = np.arange(windows) if consecutive else np.sort(rng.choice(10**6, windows, False))
    keys = rng.choice(np.append(window_keys, [-5, 10**7]), count)  # some in no window
    starts = rng.integers(0, 10_000, count)
    ends = starts + rng.integers(-50, 800, count)  # some empty
    bits = rng.integers(0, 16, count)
    window_starts = rng.integers(0, 5_000, windows)
    window_ends = window_starts + rng.integers(0, 6_000, windows)
    given = (keys, starts, ends, bits, window_keys, window_starts, window_ends, 4)
    loop = intervals._window_unions_loop
    plain = loop(*given)
    fast = compiled.compiled(loop)(*given)
    assert plain.tolist() == fast.tolist()
    for w in range(windows):
        for k in range(4):
            mine = (keys == window_keys[w]) & ((bits >> k) & 1 == 1)
            cut = intervals.clip(np.column_stack([starts[mine], ends[mine]]),
                                 window_starts[w], window_ends[w])  # fmt: skip
            assert plain[w, k] == intervals.union_length(cut)


def test_records_in_no_order_and_hostile_steps_reduce_to_the_tables_numbers(runs) -> None:
    """Records shuffled (no step order, no time order: the sorted fast paths fall back),
    steps with gaps and one near MAX_STEP (windows found by a binary search, key spaces too
    wide for a table), collectives starting before their step, and in the same chunk a
    rank with step records only and one whose file is empty."""
    shuffle = np.random.default_rng(3).permutation
    steps = [0, 1, 2, 5, 9, 2**40 - 2]
    rows: dict[int, list[dict[str, Any] | str]] = {}
    for rank in range(3):
        written: list[dict[str, Any] | str] = []
        for i, step in enumerate(steps):
            t0 = 100 * i
            written += [
                runs.step(step, t0, t0 + 100), runs.span(step, "fwd", t0 + 5, t0 + 40),
                runs.span(step, "bwd", t0 + 30, t0 + 90 + rank),
                runs.span(step, "comm_wait", t0 + 85, t0 + 99),
                runs.comm(step, t0 + 20, t0 + 60, group="tp", group_size=4),
                runs.comm(step, t0 + 10, t0 + 95, group="pp", op="send", **{"async": True}),
                runs.comm(step, t0 - 20, t0 + 5, group_size=8.0 + rank, bytes=None),
            ]  # fmt: skip
        rows[rank] = [written[i] for i in shuffle(len(written))]
    rows[3] = [runs.step(0, 0, 100), runs.step(1, 100, 200), runs.step(2, 200, 300)]
    rows[4] = []
    run_dir = runs.write(rows, runs.manifest(5))
    for warmup in (True, False):
        tables, files = _both_ways(run_dir, warmup)
        assert len(tables["rank_steps"]) == 3 * 6 + 3 - 4 * warmup
        _assert_same(tables, files)


@pytest.mark.parametrize(
    "values",
    [[2.0, 8.0, np.nan, 2.0, 64.0], [1.5, 2.0], [0.0, -0.0, 1.0], [-0.0, 0.0, 4.0],
     [np.nan, np.nan], [2.0**60, 2.0**60 + 256], [-3.0, 7.0, -3.0], [1e300, 1e300], [5.0]],
)  # fmt: skip
def test_codes_of_numbers_are_a_sorted_factorize(values: list[float]) -> None:
    """Group sizes are coded by a count over their range where they are few whole numbers
    (`comm_totals._whole_number_codes`), else by a factorize: the same codes and values to
    the bit either way (a -0.0 keeps the factorize, which keeps the first zero it meets)."""
    from diag.metrics.comm_totals import Codes

    column = np.array(values)
    codes = Codes.of(column)
    found, uniques = pd.factorize(column, sort=True)
    expected = np.where(found < 0, len(uniques), found)
    assert codes.codes.tolist() == expected.tolist()
    assert codes.size == len(uniques) + 1
    back = np.append(np.asarray(uniques, dtype=np.float64), np.nan)[expected]
    assert codes.values(codes.codes).tobytes() == back.tobytes()


def test_the_window_kept_after_reducing_is_every_record_the_metrics_need(runs) -> None:
    """`read_rank_chunk` keeps, after reducing, each file's spans and collectives of the
    first steps, its comm_wait spans and its records of steps without a step record: the
    rows a mask of those gives, in file order, for shuffled records and a step near
    MAX_STEP (whose range no table covers)."""
    from diag.numeric.keys import rank_steps_in
    from diag.rankfile.records import take
    from diag.read.load import read_rank_chunk

    shuffle = np.random.default_rng(5).permutation
    rows: dict[int, list[dict[str, Any] | str]] = {}
    for rank, far in enumerate((9, 2**40 - 2)):
        written: list[dict[str, Any] | str] = [
            runs.step(s, 100 * s, 100 * s + 100) for s in (0, 1, 2, 3)
        ]
        for s in (0, 1, 2, 3, 7, far):  # 7 and far: no step record
            written += [runs.span(s, "fwd", 100 * s, 100 * s + 50),
                        runs.span(s, "comm_wait", 100 * s + 50, 100 * s + 60),
                        runs.comm(s, 100 * s + 10, 100 * s + 20)]  # fmt: skip
        rows[rank] = [written[i] for i in shuffle(len(written))]
    run_dir = runs.write(rows, runs.manifest(2))
    files = [(rank, run_dir / rank_file_name(rank, ".jsonl")) for rank in rows]
    chunk = read_rank_chunk(files, breakdown=reduce_rank_files, keep_below=2)
    for kind in ("span", "comm"):
        expected = []
        for rank, path in files:
            columns = read_rank_file(rank, path).columns
            table, recorded = columns[kind], columns["step"]
            keep = np.asarray(table["step"]) < 2
            if kind == "span":
                keep |= np.asarray(unpack([table["phase"]]), dtype=object) == "comm_wait"
            keep |= ~rank_steps_in(table["rank"], table["step"], recorded["rank"], recorded["step"])
            expected.append({name: take(values, keep) for name, values in table.items()})
        for name in chunk.columns[kind]:
            got = pd.Series(list(unpack([chunk.columns[kind][name]])), dtype=object)
            want = pd.Series(
                list(unpack([concat([part[name] for part in expected])])), dtype=object
            )
            assert got.equals(want), (kind, name)  # NaN where NaN


def test_totals_of_keys_too_wide_for_one_integer() -> None:
    """Ranks and steps whose ranges multiplied with the labels' overflow int64 (a hostile
    run's): the totals are still one row per distinct key, in key order, as a group-by's."""
    comms = pd.DataFrame({
        "rank": [0, 2**20 - 1, 0, 2**20 - 1, 0],
        "step": [0, 2**40 - 1, 0, 2**40 - 1, 2**40 - 1],
        "op": pd.Categorical(["all_reduce", "send", "all_reduce", "recv", "send"]),
        "group": pd.Categorical(["dp", "pp", "dp", "pp", "tp"]),
        "tag": pd.Categorical([None, "a", None, "b", "c"]),
        "group_size": [2.0, 2.0, 2.0, 2.0, 8.0],
        "bytes": [10.0, 20.0, 30.0, 40.0, 50.0],
        "expected_bytes": [np.nan] * 5,
        "t0": [0, 5, 10, 20, 30],
        "t1": [1, 7, 13, 24, 35],
    })  # fmt: skip
    totals = comm_totals(comms)
    keys = ["rank", "step", "op", "group", "tag", "group_size"]
    grouped = comms.groupby(keys, observed=True, dropna=False)["bytes"].agg(["size", "sum"])
    assert totals["count"].tolist() == grouped["size"].tolist() == [2, 1, 1, 1]
    assert totals["bytes"].tolist() == grouped["sum"].tolist()
    assert totals["rank"].tolist() == [0, 0, 2**20 - 1, 2**20 - 1]
    assert totals["step"].tolist() == [0, 2**40 - 1, 2**40 - 1, 2**40 - 1]
