"""Live runs (`diag dashboard RUN --live`): each run directory still being written is followed
in a background thread, which reads only the bytes its rank files gained since the last read and
takes in each step every rank has finished once (`diag.LiveRun`: the step's rows of the per-step
tables are kept, its records dropped), diagnoses the run from the kept tables, and puts the fresh
`LoadedRun` in place of the old one in the list the pages read. `version` counts the updates;
the browser asks for it every few seconds and redraws the page when it changed
(dashboard/app.py), without a reload.

A run whose manifest says it ended is read once more and then left alone; a profiler trace
folder never grows and is not followed.
"""

from __future__ import annotations

import threading
from typing import Any

from dashboard.data import LoadedRun
from diag import LiveRun, diagnose
from diag.contract import schema


class LiveRuns:
    """Follows the growing runs of `runs` (a list the pages read; its items are replaced)."""

    def __init__(
        self, runs: list[LoadedRun], config: dict[str, Any] | None = None, interval_s: float = 2.0
    ) -> None:
        self.runs, self.config, self.interval_s = runs, config, interval_s
        self.version = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> LiveRuns:
        for index, loaded in enumerate(self.runs):
            if (loaded.run.path / schema.MANIFEST_FILE).is_file():
                thread = threading.Thread(
                    target=self._follow, args=(index,), daemon=True, name=f"live-{index}"
                )
                thread.start()
                self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _follow(self, index: int) -> None:
        live = LiveRun(self.runs[index].run.path)  # every step: the dashboard shows the run
        while not self._stop.is_set():
            manifest = live.manifest()
            if manifest is not None:
                ended = manifest.status != schema.RunStatus.RUNNING.value
                try:
                    last = live.update(manifest)
                except Exception as error:  # a live view must outlive one bad read
                    self.errors.append(f"{type(error).__name__}: {error}")
                    last = None
                if last is not None:
                    self._update(index, live)
                if ended:
                    return
            self._stop.wait(self.interval_s)

    def _update(self, index: int, live: LiveRun) -> None:
        """The run up to its last finished step, diagnosed, in place of the one shown. An
        update that fails (a run half written in a way the analysis refuses) keeps the last
        good state and the reason; the next step tries again: a live view must outlive one
        bad read."""
        try:
            run = live.run()
            metrics, report = diagnose(run, self.config, derived=live.derived())
        except Exception as error:
            self.errors.append(f"{type(error).__name__}: {error}")
            return
        with self._lock:
            self.runs[index] = LoadedRun(self.runs[index].name, run, metrics, report)
            self.version += 1
