"""What the host did to a rank (collectors/host.py): the sampler's counters, the step record's
host fields, and rank files written before those fields, which still read (as null)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pyarrow as pa

from collectors.host import HostReading, HostSampler, usable_cores
from diag.rankfile import arrow_fast, arrow_format
from diag.rankfile.rank_file import KEPT_COLUMNS, NUMERIC_COLUMNS
from diag.read.load import load_run
from tests.unit.test_hostile_arrow import stream, write_run

HOST_FIELDS = ("cpu_ns", "runq_ns", "nivcsw", "load1", "proc_cpu_ns", "proc_runq_ns")


def test_the_threads_cpu_time_grows_with_work_and_not_with_sleep() -> None:
    sampler = HostSampler()
    start = sampler.read()
    deadline = time.perf_counter() + 0.05
    while time.perf_counter() < deadline:
        pass
    busy = sampler.read()
    time.sleep(0.05)
    idle = sampler.read()
    fields = sampler.step_fields(start, busy)
    assert fields["cpu_ns"] > 20e6  # 50 ms of spinning, less what a loaded host took
    assert sampler.step_fields(busy, idle)["cpu_ns"] < 10e6  # sleeping costs no CPU
    if sys.platform == "linux":
        assert fields["runq_ns"] is not None and fields["nivcsw"] is not None
        assert fields["load1"] is not None and fields["load1"] >= 0
    sampler.close()
    assert sampler.read().runq_ns is None  # closed: the run-queue source is gone, no error


def test_a_missing_reading_gives_null_fields_never_an_error() -> None:
    sampler = HostSampler()
    fields = sampler.step_fields(None, HostReading(cpu_ns=None, runq_ns=None, nivcsw=None))
    assert fields["cpu_ns"] is None and fields["runq_ns"] is None and fields["nivcsw"] is None
    sampler.close()
    assert (usable_cores() or 1) >= 1


def _without_host_fields(data: bytes) -> bytes:
    """The stream as a writer before the host fields wrote it (same records, older schema)."""
    reader = pa.ipc.open_stream(data)
    old_step = pa.struct([f for f in arrow_format.kind_type("step") if f.name not in HOST_FIELDS])
    fields = [pa.field("step", pa.list_(old_step)) if f.name == "step" else f
              for f in arrow_format.STREAM_SCHEMA]  # fmt: skip
    schema = pa.schema(fields, metadata=arrow_format.STREAM_SCHEMA.metadata)
    batches = []
    for batch in reader:
        column = batch.column("step")
        values = column.values
        keep = [i for i in range(values.type.num_fields)
                if values.type.field(i).name not in HOST_FIELDS]  # fmt: skip
        struct = pa.StructArray.from_arrays([values.field(i) for i in keep],
                                            [values.type.field(i).name for i in keep],
                                            mask=values.is_null())  # fmt: skip
        steps = pa.ListArray.from_arrays(column.offsets, struct, mask=column.is_null())
        arrays = [steps if name == "step" else batch.column(name) for name in schema.names]
        batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return stream(schema, batches)


def test_a_rank_file_from_before_the_host_fields_reads_them_as_null(tmp_path: Path) -> None:
    arrow_fast.prepare()  # the compiled loops, so that declining is theirs to do
    run = write_run(tmp_path)
    for path in run.glob("rank-*.arrows"):
        old = _without_host_fields(path.read_bytes())
        # the compiled reader takes only today's layout; an older file takes the general path
        assert arrow_fast.decode_fast(old, path.name, KEPT_COLUMNS, NUMERIC_COLUMNS) is None
        path.write_bytes(old)
    data = load_run(run)
    assert len(data.steps) == 6 and not data.skipped
    for name in HOST_FIELDS:
        assert all(math.isnan(value) for value in data.steps[name])
