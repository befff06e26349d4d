"""The host's watched calls tallied (host_calls.py): each class picked out by its names, an
.item() and the sync inside it counted once, only the calls before the last step's start,
compared exactly where that start is an int no double holds."""

from __future__ import annotations

from diag.read.kineto.host_calls import HostCalls, HostCallScan

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _scan(calls: list[tuple[float, float, str]]) -> HostCallScan:
    scan = HostCallScan()
    for start, duration, name in calls:
        scan.add(start, duration, name)
    return scan


def test_the_calls_are_tallied_by_class() -> None:
    scan = _scan([
        (1.0, 1.5, "cudaLaunchKernel"), (3.0, 2.25, "cuLaunchKernel"),
        (6.0, 3.0, "cudaLaunchKernel"), (9.5, 0.5, "cudaGraphLaunch"),
        (10.0, 10.0, "aten::item"), (11.0, 8.0, "aten::_local_scalar_dense"),
        (12.0, 3.0, "cudaStreamSynchronize"),  # inside the .item(): the read's own wait
        (30.0, 1.0, "cudaDeviceSynchronize"), (40.0, 5.0, LOADER), (41.0, 1.0, "aten::mm"),
        (100.0, 7.0, "cudaLaunchKernel"),  # after the last step's start: not counted
    ])  # fmt: skip
    assert scan.result(50) == HostCalls(
        sync_calls=2, sync_us=11.0, scalar_reads=1, launches=3, launch_us=6.75,
        graph_launches=1, loader_us=5.0,
    )  # fmt: skip
    assert scan.result(None).launches == 4


def test_a_scalar_read_without_its_item_is_read_from_the_copy() -> None:
    scan = _scan([(10.0, 8.0, "aten::_local_scalar_dense"), (12.0, 2.0, "cudaMemcpy")])
    assert scan.result(None) == HostCalls(
        sync_calls=1, sync_us=8.0, scalar_reads=1, launches=0, launch_us=0.0,
        graph_launches=0, loader_us=0.0,
    )  # fmt: skip


def test_the_last_step_s_start_is_compared_exactly() -> None:
    start = float(2**53)  # before 2**53 + 1, which no double holds (as a double: equal)
    scan = _scan([(start, 1.0, "cudaLaunchKernel")])
    assert scan.result(2**53 + 1).launches == 1
    assert scan.result(2**53).launches == 0
