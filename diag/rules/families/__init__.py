"""One module per rule family; each registers its rules with `diag.rules.engine.rule`."""

from diag.rules.families import communication  # noqa: F401
