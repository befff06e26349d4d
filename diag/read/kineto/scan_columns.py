"""The C scanner's columns (`event_scan.c`'s enum, as scanned.py reads them) and the flags of
the strings its codes name (a cat's or a name's: what the converter does with its events)."""

from __future__ import annotations

from diag.read.kineto import one_pass
from diag.read.kineto.convert import (
    DEVICE_OF_CATEGORY,
    GPU_CATEGORIES,
    LAUNCH_CATEGORIES,
    LEGACY_CATEGORIES,
    PROFILER_RANGE,
)
from diag.read.kineto.host_calls import LOADER_PREFIX, WATCHED

# the scanner's columns (event_scan.c's enum)
(KIND, START, END, PH, CAT, NAME, TS_KIND, TS, DUR_KIND, DUR, TID_KIND, TID, ARGS,
 CORRELATION_KIND, CORRELATION, STREAM_KIND, STREAM, COLLECTIVE, ARGS_START, ARGS_END,
 CORRELATION_AT, CORRELATION_END, EXTERNAL_AT, EXTERNAL_END, NCOL) = range(25)  # fmt: skip
F_TS, F_DUR = 0, 1
ODD, PH_X, INT, FLOAT = 1, 1, 1, 2
BY_NAME_PREFIXES = ("nccl:", "gloo:", "c10d::", "record_param_comms", "ProfilerStep")
"""Names whose events the converter keeps with their arguments, or reads as steps."""


# a string's flags, as a cat or as a name
BY_LOOP = 1  # taken by one_pass.take: a category read as another's, or CUPTI's range
OWN_ARGS = 2  # its event's arguments or raw time are kept: a step, scope, annotation, op
TRACE, GPU, CPU_OP, LAUNCH, WATCHED_CALL, SYNC = 4, 8, 16, 32, 64, 128
NCCL, ENQUEUE, GPU_ANNOTATION, PARAMS, STEP, KEPT_BY_NAME = 256, 512, 1024, 2048, 4096, 8192


def string_flags(text: str) -> int:
    """A cat's or a name's flags (above)."""
    tests = (
        (BY_LOOP, text in LEGACY_CATEGORIES or text in DEVICE_OF_CATEGORY
         or text == PROFILER_RANGE),
        (OWN_ARGS, text.startswith(BY_NAME_PREFIXES)), (TRACE, text == "Trace"),
        (GPU, text in GPU_CATEGORIES), (CPU_OP, text == "cpu_op"),
        (LAUNCH, text in LAUNCH_CATEGORIES),
        (WATCHED_CALL, text in WATCHED or text.startswith(LOADER_PREFIX)),
        (SYNC, text in one_pass.SYNC_NAMES), (NCCL, text.startswith("nccl:")),
        (ENQUEUE, text.startswith(one_pass.STEP_OR_ENQUEUE)),
        (GPU_ANNOTATION, text == "gpu_user_annotation"), (PARAMS, text == "record_param_comms"),
        (STEP, text.startswith("ProfilerStep")),
        (KEPT_BY_NAME, text.startswith(one_pass.KEPT_BY_NAME)),
    )  # fmt: skip
    return sum(flag for flag, holds in tests if holds)
