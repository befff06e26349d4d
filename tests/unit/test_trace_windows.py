"""A repeating profiler schedule (`schedule(wait, warmup, active, repeat=2)` with
`tensorboard_trace_handler`) writes one file per rank per profiled window: the folder is read
as one window of every rank, the others named in a note, where it used to exit 2 ("several
trace files claim one rank")."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from diag.api import analyze_path
from diag.cli.main import main
from diag.errors import InputError
from diag.read.kineto import load_trace_dir

STEP = re.compile(r'"ProfilerStep#(\d+)"')


def _later_window(source: Path, target: Path, shift: int) -> None:
    """The same rank's trace as a later window: its step numbers `shift` on."""
    text = source.read_text()
    target.write_text(STEP.sub(lambda m: f'"ProfilerStep#{int(m.group(1)) + shift}"', text))


@pytest.fixture(scope="module")
def window(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 ranks, 4 steps, rank 1 a 50 ms straggler: one profiled window."""
    folder = tmp_path_factory.mktemp("windows") / "one"
    result = CliRunner().invoke(main, [
        "simulate", "--ranks", "2", "--steps", "4", "--format", "kineto", "--out", str(folder),
        "--inject", "straggler:rank=1,ms=50",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return folder


def _two_windows(window: Path, root: Path, ranks: tuple[int, ...]) -> Path:
    folder = root / "two"
    shutil.copytree(window, folder, ignore=shutil.ignore_patterns(".diag-cache"))
    for path in sorted(window.glob("*.pt.trace.json")):
        rank = int(path.name.split("_")[1].split(".")[0]) - 50000
        if rank in ranks:
            _later_window(path, folder / path.name.replace(".pt.", ".later.pt."), 100)
    return folder


def test_each_rank_s_later_window_is_analysed_and_the_other_named(
    window: Path, tmp_path: Path
) -> None:
    report = analyze_path(_two_windows(window, tmp_path, (0, 1)))
    assert report["summary"]["ranks_analysed"] == 2
    steps = {row["step"] for row in load_trace_dir(_two_windows(window, tmp_path / "b", (0, 1)))
             .steps.to_dict("records")}  # fmt: skip
    assert steps == {100, 101, 102, 103}
    assert any("2 profiled windows" in note and "not steps 0-3" in note
               for note in report["skipped"])  # fmt: skip
    # the window reads as it reads alone
    alone = analyze_path(window)
    assert [(f["rule"], f["ranks"]) for f in report["findings"]] == [
        (f["rule"], f["ranks"]) for f in alone["findings"]
    ]


def test_the_window_every_rank_has_wins(window: Path, tmp_path: Path) -> None:
    # only rank 0 was traced in the later window: the earlier one has both ranks
    run = load_trace_dir(_two_windows(window, tmp_path, (0,)))
    assert set(run.steps["step"]) == {0, 1, 2, 3}
    assert set(run.steps["rank"]) == {0, 1}


def test_files_of_one_rank_over_the_same_steps_are_refused(window: Path, tmp_path: Path) -> None:
    folder = tmp_path / "copied"
    shutil.copytree(window, folder, ignore=shutil.ignore_patterns(".diag-cache"))
    first = sorted(folder.glob("*.pt.trace.json"))[0]
    shutil.copy(first, folder / first.name.replace(".pt.", ".copy.pt."))
    with pytest.raises(InputError, match="overlap"):
        load_trace_dir(folder)
