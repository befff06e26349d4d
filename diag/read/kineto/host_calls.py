"""What the CPU did that keeps a GPU waiting for its host, tallied from a trace's CPU events:
the likely causes HST002 names (diag/rules/families/host.py).

- synchronising calls: the CUDA runtime's `cudaStreamSynchronize`, `cudaDeviceSynchronize`,
  `cudaEventSynchronize`, the synchronous `cudaMemcpy`, and PyTorch's `aten::item` /
  `aten::_local_scalar_dense` (`.item()`, `float(tensor)`, a Python `if` on a GPU tensor): the
  CPU stops until the GPU has drained, then the GPU waits while the CPU launches again;
- kernel launches (`cudaLaunchKernel`, `cuLaunchKernel`, `cudaLaunchKernelExC`, and their ROCm
  names): their count and time; CUDA graph launches (`cudaGraphLaunch`) counted apart;
- the data loader: `enumerate(DataLoader)#...__next__`, the time the training thread waited
  for its next batch.
Only calls that start before `last_start` (the last ProfilerStep's start, which the device time
leaves out) count, so the tallies cover the same steps as the idle time.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
})  # fmt: skip
SCALAR_READS = frozenset({"aten::item", "aten::_local_scalar_dense"})
"""`.item()`: the outer op and the one that copies the value to the CPU (counted once: item)."""
LAUNCH_CALLS = frozenset({
    "cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
    "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel",
})  # fmt: skip
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "hipGraphLaunch"})
LOADER_PREFIX = "enumerate(DataLoader)"
WATCHED = SYNC_CALLS | SCALAR_READS | LAUNCH_CALLS | GRAPH_LAUNCHES
"""The CPU events tallied, with those named from LOADER_PREFIX (one_pass.take's test)."""


@dataclass(frozen=True)
class HostCalls:
    sync_calls: int  # CUDA synchronising calls and .item() reads
    sync_us: float  # their time on the CPU (an .item() and the sync inside it counted once)
    scalar_reads: int  # of the synchronising calls, .item() reads
    launches: int  # kernel launches
    launch_us: float  # their time on the CPU
    graph_launches: int  # CUDA graph launches
    loader_us: float  # waiting for the data loader's next batch


class HostCallScan:
    """The watched calls of one trace, gathered as its events are read: a column each (start
    and duration in us as doubles, the name one object a name: `add`), as a tuple a call with
    its own decoded name held about 150 bytes more (a launch's call comes with every kernel)."""

    def __init__(self) -> None:
        self.starts = array("d")
        self.durations = array("d")
        self.names: list[str] = []
        self._names: dict[str, str] = {}

    def add(self, start: float, duration: float, name: str) -> None:
        self.starts.append(start)
        self.durations.append(duration)
        self.names.append(self._names.setdefault(name, name))

    @property
    def calls(self) -> list[tuple[float, float, str]]:
        """Each call as (start, duration, name)."""
        return list(zip(self.starts, self.durations, self.names, strict=True))

    def result(self, last_start: float | None) -> HostCalls:
        """The tallies of the calls that start before `last_start` (None: all), each class's
        calls picked out by the codes of their names (a launch's call comes with every
        kernel: one Python pass each was a tenth of a communication-heavy trace's device
        time), their times summed as Python floats in their order."""
        starts = np.frombuffer(self.starts, dtype=np.float64)
        durations = np.frombuffer(self.durations, dtype=np.float64)
        if last_start is None:
            kept = np.ones(len(starts), dtype=bool)
        elif float(last_start) == last_start:
            kept = starts < last_start
        else:  # an int no double holds: compared exactly, as Python does
            kept = np.array([start < last_start for start in self.starts], dtype=bool)
        code_of = {name: code for code, name in enumerate(dict.fromkeys(self.names))}
        codes = np.fromiter(map(code_of.__getitem__, self.names), np.int64, len(self.names))

        def named(wanted: Callable[[str], bool]) -> np.ndarray:
            return kept & np.isin(codes, [code for name, code in code_of.items() if wanted(name)])

        ends = starts + durations

        def spans(mask: np.ndarray) -> list[tuple[float, float]]:
            return list(zip(starts[mask].tolist(), ends[mask].tolist(), strict=True))

        syncs = spans(named(SYNC_CALLS.__contains__))
        items = spans(named("aten::item".__eq__))
        reads = sorted(items or spans(named("aten::_local_scalar_dense".__eq__)))
        # a sync inside an .item() is that read's own wait: counted once, as the read
        inside = [s for s in syncs if not _within(s, reads)]
        launches = durations[named(LAUNCH_CALLS.__contains__)].tolist()
        return HostCalls(
            sync_calls=len(inside) + len(reads),
            sync_us=float(sum(b - a for a, b in inside) + sum(b - a for a, b in reads)),
            scalar_reads=len(reads),
            launches=len(launches),
            launch_us=float(sum(launches)),
            graph_launches=int(named(GRAPH_LAUNCHES.__contains__).sum()),
            loader_us=float(sum(durations[named(lambda n: n.startswith(LOADER_PREFIX))].tolist())),
        )


def _within(call: tuple[float, float], spans: list[tuple[float, float]]) -> bool:
    """Whether `call` lies inside one of `spans` (sorted by start; they do not nest)."""
    i = bisect.bisect_right(spans, (call[0], float("inf"))) - 1
    return i >= 0 and spans[i][1] >= call[1]
