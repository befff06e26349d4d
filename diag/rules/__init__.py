"""The rules engine and its catalogue. Importing this package registers every rule family."""

from diag.rules.engine import (
    REGISTRY,
    Diagnosis,
    Finding,
    Rule,
    RuleContext,
    Threshold,
    check_config,
    limits_for,
    rule,
    run_rules,
)

# Rule families register themselves on import (one module per family).
from diag.rules import families  # noqa: F401  (isort: skip)

__all__ = [
    "REGISTRY",
    "Diagnosis",
    "Finding",
    "Rule",
    "RuleContext",
    "Threshold",
    "check_config",
    "limits_for",
    "rule",
    "run_rules",
]
