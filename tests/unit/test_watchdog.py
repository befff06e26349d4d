"""The recorder's watchdog and the evidence a failing rank leaves (collectors/watchdog.py,
collectors/inflight.py, collectors/exits.py), on a real Recorder whose "training thread" is a
real thread stuck where the test holds it. The distributed cases (a hang, a crash, torchrun's
SIGTERM across real gloo ranks) are tests/distributed/test_failure_evidence.py."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import collectors.watchdog as watchdog_module
from collectors import Recorder
from collectors.watchdog import Watchdog, WatchdogConfig, main_stack
from tests.unit.collector_helpers import _clean_env, of_kind, read_records  # noqa: F401

FLOOR_S = 0.2


def stuck_in_forward(release: threading.Event) -> None:
    """Where the training thread waits (a deadlock, a stuck loader) until the test lets go."""
    release.wait(30)


class Training:
    """A thread that runs steps of `rec` and blocks in the forward of the steps it is told to."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.releases = [threading.Event(), threading.Event()]  # one per step
        self.blocked = [threading.Event(), threading.Event()]
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.rec.main_thread_id = threading.get_ident()  # this thread is the one to watch
        for step in range(2):
            with self.rec.step(tokens=1), self.rec.span("fwd"):
                self.blocked[step].set()
                stuck_in_forward(self.releases[step])

    def __enter__(self) -> Training:
        self.thread.start()
        assert self.blocked[0].wait(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        for release in self.releases:
            release.set()
        self.thread.join(10)


@pytest.fixture
def rec(tmp_path: Path) -> Iterator[Recorder]:
    recorder = Recorder(tmp_path, watchdog=False)  # the tests drive their own watchdog
    yield recorder
    recorder.close()


def config(**overrides: float) -> WatchdogConfig:
    return WatchdogConfig(**{"stall_factor": 5.0, "stall_floor_s": FLOOR_S,
                             "heartbeat_s": 60.0, **overrides})  # fmt: skip


def test_a_stall_is_written_once_per_episode_with_the_main_stack_as_data(
    rec: Recorder, tmp_path: Path
) -> None:
    dog = Watchdog(rec, config(stall_factor=0.1))  # the stuck first step is the median
    with Training(rec) as training:
        assert dog.tick() and dog.stalls == 0  # not silent for long enough yet
        time.sleep(FLOOR_S * 1.5)
        for _ in range(3):
            dog.tick()
        assert dog.stalls == 1  # one episode, one stall
        training.releases[0].set()  # progress: the next step opens and blocks again
        assert training.blocked[1].wait(10)
        time.sleep(FLOOR_S * 1.5)
        dog.tick()
        dog.tick()
        assert dog.stalls == 2  # a new episode after progress
    rec.flush()
    stalls = of_kind(read_records(tmp_path), "event", name="stall")
    assert [s["step"] for s in stalls] == [0, 1]
    for stall in stalls:
        assert stall["idle_s"] >= stall["threshold_s"] == FLOOR_S
        assert all(set(frame) == {"file", "line", "function"} for frame in stall["stack"])
        functions = [f["function"] for f in stall["stack"]]
        assert functions[-1] == "wait"  # innermost last: threading's wait, in ...
        assert functions[functions.index("stuck_in_forward") - 1] == "_run"  # ... the forward
        assert stall["fr_file"] == "flight-recorder/rank-00000.json" or stall["fr_error"]
    # written with the stall: where the rank is (the open step and span)
    opened = of_kind(read_records(tmp_path), "event", name="span_open")
    assert opened and opened[0]["phase"] == "fwd" and opened[0]["step"] == 0


def test_the_threshold_is_the_median_step_times_the_factor_or_the_floor() -> None:
    cfg = WatchdogConfig(stall_factor=5, stall_floor_s=10, heartbeat_s=2)
    assert cfg.threshold_s(None) == 10 and cfg.threshold_s(1.0) == 10
    assert cfg.threshold_s(3.0) == 15


def test_the_knobs_come_from_arguments_then_the_environment(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DIAG_STALL_FACTOR", "3")
    monkeypatch.setenv("DIAG_STALL_FLOOR_S", "oops")
    with caplog.at_level(logging.WARNING, logger="collectors"):
        cfg = WatchdogConfig.resolve(heartbeat_s=0.5)
    assert (cfg.stall_factor, cfg.stall_floor_s, cfg.heartbeat_s) == (3.0, 10.0, 0.5)
    assert "DIAG_STALL_FLOOR_S" in caplog.text  # a bad value is said once, never fatal
    assert WatchdogConfig.resolve(stall_factor=7).stall_factor == 7


def test_heartbeats_flush_the_open_state_while_a_step_is_open(
    rec: Recorder, tmp_path: Path
) -> None:
    dog = Watchdog(rec, config(stall_floor_s=60, heartbeat_s=0.05))
    with Training(rec):
        time.sleep(0.1)
        dog.tick()
        # on disk while the step is still open, without any training-thread flush
        records = read_records(tmp_path)
        (heartbeat,) = of_kind(records, "event", name="heartbeat")
        assert heartbeat["interval_s"] == 0.05 and heartbeat["step"] == 0
        (step_open,) = of_kind(records, "event", name="step_open")
        assert step_open["step"] == 0
        assert not of_kind(records, "step")
    rec.flush()
    assert of_kind(read_records(tmp_path), "step")  # the step, completed, supersedes it


def test_a_watchdog_flush_never_waits_for_a_writer_the_training_side_holds(
    rec: Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training-thread flush stuck in its write holds the file: the watchdog gives up after
    a moment (its records go out with the next flush) instead of waiting with it."""
    monkeypatch.setattr(watchdog_module, "FLUSH_TIMEOUT_S", 0.05)
    dog = Watchdog(rec, config(stall_floor_s=60, heartbeat_s=0.01))
    with Training(rec):
        rec.parts.writer._io_lock.acquire()
        try:
            time.sleep(0.02)
            started = time.monotonic()
            assert dog.tick()
            assert time.monotonic() - started < 1.0
            assert not of_kind(read_records(tmp_path), "event", name="heartbeat")
        finally:
            rec.parts.writer._io_lock.release()
        rec.flush()
        assert of_kind(read_records(tmp_path), "event", name="heartbeat")


def test_errors_in_the_watchdog_are_swallowed_and_logged_once(
    rec: Recorder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[float] = []

    def broken(*args: Any) -> bool:
        calls.append(time.monotonic())
        raise OSError("disk gone")

    monkeypatch.setattr(rec, "flush_from_thread", broken)
    dog = Watchdog(rec, config(stall_floor_s=60, heartbeat_s=0.01))
    with caplog.at_level(logging.WARNING, logger="collectors"), Training(rec):
        dog.start()
        deadline = time.monotonic() + 10
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dog._thread.is_alive()  # still watching after the errors
    dog.stop()
    assert len(calls) >= 3
    assert caplog.text.count("disk gone") == 1


def test_main_stack_reads_another_threads_frames_innermost_last() -> None:
    release = threading.Event()
    thread = threading.Thread(target=stuck_in_forward, args=(release,), daemon=True)
    thread.start()
    try:
        time.sleep(0.05)
        assert thread.ident is not None
        stack = main_stack(thread.ident)
    finally:
        release.set()
        thread.join()
    functions = [f["function"] for f in stack]
    assert functions[0] == "_bootstrap" and functions[-1] == "wait"  # outermost first
    assert "stuck_in_forward" in functions
    assert main_stack(-1) == []  # a thread that is gone


def test_a_step_that_raises_records_the_exception_and_close_says_so(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, watchdog=False)
    with pytest.raises(ValueError), rec.step(), rec.span("fwd"):
        raise ValueError("bad batch " + "x" * 3000)
    rec.close("failed")
    records = read_records(tmp_path)
    (exception,) = of_kind(records, "event", name="exception")
    assert exception["type"] == "ValueError" and len(exception["message"]) == 2000
    assert exception["frames"][-1]["function"].startswith("test_a_step_that_raises")
    assert exception["step"] == 0
    (closed,) = of_kind(records, "event", name="rank_closed")
    assert closed["status"] == "failed" and closed is records[-1]


def test_collectives_carry_their_order_in_the_group_and_stay_open_until_done(
    rec: Recorder, tmp_path: Path
) -> None:
    with rec.step():
        with rec.collective("all_reduce", 8, tag="a"):
            pass
        with rec.collective("send", 4, peer=1, tag="b"):
            rec.flush()  # issued, not completed: written as in flight
    rec.flush()
    records = read_records(tmp_path)
    assert [(c["op"], c["seq"]) for c in of_kind(records, "comm")] == [("all_reduce", 1),
                                                                        ("send", 2)]  # fmt: skip
    assert of_kind(records, "comm", op="send")[0]["peer"] == 1
    (issued,) = of_kind(records, "event", name="comm_issued")
    assert (issued["op"], issued["seq"], issued["peer"], issued["tag"]) == ("send", 2, 1, "b")


SCRIPT = textwrap.dedent(
    """
    import sys, time
    from collectors import Recorder
    rec = Recorder(sys.argv[1], watchdog=False)
    if sys.argv[2] == "raise":
        with rec.step():
            pass
        raise KeyError("outside any step")
    with rec.step(), rec.span("fwd"):
        print("ready", flush=True)
        time.sleep(60)
    """
)


def _script(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path), mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_an_uncaught_exception_is_recorded_and_the_previous_hook_still_runs(
    tmp_path: Path,
) -> None:
    job = _script(tmp_path, "raise")
    _, stderr = job.communicate(timeout=60)
    assert job.returncode == 1 and "KeyError: 'outside any step'" in stderr  # the usual report
    (exception,) = of_kind(read_records(tmp_path), "event", name="exception")
    assert exception["type"] == "KeyError" and exception["frames"][-1]["function"] == "<module>"


def test_sigterm_flushes_the_open_state_and_the_process_still_ends_by_it(tmp_path: Path) -> None:
    job = _script(tmp_path, "sleep")
    assert job.stdout is not None and job.stdout.readline().strip() == "ready"
    job.send_signal(signal.SIGTERM)
    job.communicate(timeout=30)
    assert job.returncode == -signal.SIGTERM  # the default handler's end, chained
    records = read_records(tmp_path)
    (received,) = of_kind(records, "event", name="signal")
    assert received["signal"] == "SIGTERM" and received["step"] == 0
    assert of_kind(records, "event", name="span_open")[0]["phase"] == "fwd"
