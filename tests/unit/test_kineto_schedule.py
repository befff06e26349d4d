"""The pipeline's micro-batches per step (m) and virtual stages (v) read from a trace folder's
sends and receives between pipeline neighbours (diag/read/kineto/schedule.py, issue 39), in
each shape `diag simulate --format kineto` writes: peers named (megatron: batched, `Dst Rank`
/ `Src Rank`), unnamed (devicemesh: the group only), older traces without group arguments
(the layout given or inferred from the placement), one traced rank per tensor-parallel group;
1F1B, GPipe and interleaved at a few (p, m, v); a window cut short; counts that disagree; and
PIP002 from a bubble's trace folder read with nothing given."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from diag.api import analyze_path
from diag.cli.options import parse_layout
from diag.contract.schema import Manifest
from diag.outputs.report_lines import headline
from diag.read.kineto import load_trace_dir


@dataclass(frozen=True)
class Job:
    dp: int
    tp: int
    pp: int
    m: int
    v: int
    schedule: str
    shape: str  # devicemesh | megatron | old | one-per-tp

    def args(self) -> list[str]:
        shape = (["--trace-shape", "devicemesh", "--traced-ranks", "one-per-tp"]
                 if self.shape == "one-per-tp" else ["--trace-shape", self.shape])  # fmt: skip
        return ["--ranks", str(self.dp * self.tp * self.pp),
                "--layout", f"dp={self.dp},tp={self.tp},pp={self.pp}",
                "--layers", str(self.pp * self.v * -(-8 // (self.pp * self.v))),
                "--microbatches", str(self.m),
                "--virtual-stages", str(self.v), "--schedule", self.schedule, "--steps", "3",
                "--format", "kineto", *shape]  # fmt: skip

    def name(self) -> str:
        return f"{self.shape}-{self.schedule}-p{self.pp}-m{self.m}-v{self.v}"


READ = [
    Job(2, 1, 4, 8, 1, "1f1b", "devicemesh"),
    Job(2, 1, 4, 8, 2, "interleaved", "megatron"),
    Job(2, 1, 3, 6, 1, "gpipe", "megatron"),
    Job(2, 1, 3, 3, 3, "interleaved", "devicemesh"),
    Job(2, 1, 4, 4, 2, "interleaved", "old"),
    Job(1, 2, 4, 8, 2, "interleaved", "one-per-tp"),
    Job(2, 1, 2, 8, 1, "1f1b", "megatron"),  # two stages: 8 = m x (2v - 1) is m=8, v=1
]
"""Jobs whose m and v the traces say."""
TWO_STAGES_INTERLEAVED = Job(2, 1, 2, 4, 2, "interleaved", "devicemesh")
"""12 messages each way per step: m=12, v=1 or m=4, v=2; the counts do not tell."""
OLD_PIPELINE = Job(1, 1, 4, 8, 2, "interleaved", "old")
"""No group arguments and only a pipeline: the layout inferred from the placement."""
BUBBLE = Job(2, 1, 4, 4, 1, "1f1b", "devicemesh")
"""As many micro-batches as stages: PIP002's bubble."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[Job, Path]:
    """Every job's trace folder, simulated once for the module (the simulations side by side:
    each is mostly a process starting)."""
    work = tmp_path_factory.mktemp("schedules")
    jobs = [*READ, TWO_STAGES_INTERLEAVED, OLD_PIPELINE, BUBBLE]
    running = [
        subprocess.Popen([sys.executable, "-m", "diag", "simulate", "--out",
                          str(work / job.name()), *job.args()],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for job in jobs
    ]  # fmt: skip
    for job, process in zip(jobs, running, strict=True):
        _, error = process.communicate(timeout=600)
        assert process.returncode == 0, f"{job.name()}: {error.decode()[-300:]}"
    return {job: work / job.name() for job in jobs}


def _manifest(folder: Path, layout: str | None = None) -> Manifest:
    return load_trace_dir(folder, layout=parse_layout(layout), use_cache=False).manifest


@pytest.mark.parametrize("job", READ, ids=[job.name() for job in READ])
def test_m_and_v_are_read_from_the_sends_between_stages(folders: dict[Job, Path], job: Job) -> None:
    manifest = _manifest(folders[job])  # the layout too: an old trace's from its placement
    assert (manifest.layout.pp, manifest.layout.microbatches, manifest.layout.virtual_stages) \
        == (job.pp, job.m, job.v), manifest.layout_source  # fmt: skip
    assert manifest.schedule_known
    assert f"schedule read: m={job.m}, v={job.v} (" in str(manifest.layout_source)


def test_an_older_traces_pipeline_inferred_from_its_placement_reads_m_and_v(
    folders: dict[Job, Path],
) -> None:
    manifest = _manifest(folders[OLD_PIPELINE])
    assert str(manifest.layout_source).startswith("inferred: ")
    assert (manifest.layout.pp, manifest.layout.microbatches, manifest.layout.virtual_stages) \
        == (4, 8, 2)  # fmt: skip
    assert manifest.schedule_known


def test_two_stages_interleaved_leave_m_and_v_unknown(folders: dict[Job, Path]) -> None:
    manifest = _manifest(folders[TWO_STAGES_INTERLEAVED])
    assert manifest.layout.pp == 2 and not manifest.schedule_known
    assert "schedule unknown: 12 sends per step" in str(manifest.layout_source)
    assert "m x (2v - 1)" in str(manifest.layout_source)


def test_the_layouts_m_and_v_override_the_traces(folders: dict[Job, Path]) -> None:
    job = READ[1]  # m=8, v=2
    manifest = _manifest(folders[job], "dp=2,pp=4,m=5,v=3")
    assert (manifest.layout.microbatches, manifest.layout.virtual_stages) == (5, 3)
    assert str(manifest.layout_source).split(";")[0] == "given" and manifest.schedule_known
    assert "schedule" not in str(manifest.layout_source)
    manifest = _manifest(folders[job], "dp=2,pp=4,m=8")  # v read where the traces say it
    assert (manifest.layout.microbatches, manifest.layout.virtual_stages) == (8, 2)


def _cut_last_step(folder: Path, into: Path) -> Path:
    """The folder with every rank's trace cut halfway through its last ProfilerStep, as a
    trace of a job stopped mid-step is: the events after the cut gone, the step shortened."""
    into.mkdir()
    for path in sorted(folder.iterdir()):
        if not path.name.endswith((".json", ".json.gz")):
            continue
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt") as f:
            trace = json.load(f)
        steps = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith(
            "ProfilerStep#")]  # fmt: skip
        last = max(steps, key=lambda e: e["ts"])
        cut = last["ts"] + last["dur"] / 2
        trace["traceEvents"] = [e for e in trace["traceEvents"]
                                if e.get("ph") != "X" or e["ts"] < cut]  # fmt: skip
        last["dur"] = cut - last["ts"]
        with opener(into / path.name, "wt") as f:
            json.dump(trace, f)
    return into


def test_a_window_cut_short_reads_its_whole_steps(folders: dict[Job, Path], tmp_path: Path) -> None:
    job = READ[0]
    cut = _cut_last_step(folders[job], tmp_path / "cut")
    sends = load_trace_dir(cut, use_cache=False).comms
    per_step = sends[(sends["op"].astype(str) == "send") & (sends["rank"] == 1)].groupby(
        "step").size()  # fmt: skip
    assert per_step.iloc[-1] < per_step.iloc[0]  # the last step lost sends: not whole
    manifest = _manifest(cut)
    assert (manifest.layout.microbatches, manifest.layout.virtual_stages) == (job.m, job.v)
    assert manifest.schedule_known


def test_pipelines_whose_counts_disagree_leave_m_and_v_unknown(
    folders: dict[Job, Path], tmp_path: Path
) -> None:
    """The first pipeline's ranks from a job of m=8, the second's from one of m=4 (both
    dp2 x pp4, 1F1B): nothing says which m is the job's."""
    eight, four = READ[0], BUBBLE
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for source, ranks in ((folders[eight], range(0, 4)), (folders[four], range(4, 8))):
        for rank in ranks:
            (found,) = [
                p for p in source.iterdir() if p.name.endswith(f"_{50000 + rank}.pt.trace.json")
            ]
            shutil.copy(found, mixed / found.name)
    manifest = _manifest(mixed)
    assert manifest.layout.pp == 4 and not manifest.schedule_known
    assert "schedule unknown: the counts between neighbouring stages disagree" in str(
        manifest.layout_source
    )


def test_a_bubbles_trace_folder_reads_pip002_with_nothing_given(
    folders: dict[Job, Path],
) -> None:
    report = analyze_path(folders[BUBBLE])
    rules = [finding["rule"] for finding in report["findings"]]
    assert "PIP002" in rules
    assert report["summary"]["bubble_theory"] == pytest.approx(3 / 7)
    assert "m=4, v=1 read from the sends per step" in headline(report)
