"""One module per rule family; each registers its rules with `diag.rules.engine.rule`."""

from diag.rules.families import communication, memory, moe, pitfalls, trend  # noqa: F401
