"""One module per rule family; each registers its rules with `diag.rules.engine.rule`."""

from diag.rules.families import (  # noqa: F401
    balance,
    communication,
    failure,
    gpu_starved,
    gpu_waits,
    host,
    lost_time,
    memory,
    moe,
    pipeline,
    pitfalls,
    topology,
    trend,
)
