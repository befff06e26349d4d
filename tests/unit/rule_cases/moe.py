"""Cases for the MoE family (pattern 4)."""

from __future__ import annotations

from typing import Any

from rule_cases import RuleCase
from rule_cases._state_runs import state_run

MODEL = {"experts": 4, "topk": 2, "capacity_factor": 1.25, "aux_loss_coef": 0.01}


def _moe(runs: Any, tokens: list[int], dropped: int = 0, a2a_ratio: float = 1.0,
         **model: Any) -> Any:  # fmt: skip
    def records(rank: int, step: int) -> list[Any]:
        rows = [runs.experts(step, 0, tokens, dropped=dropped)] if rank == 0 else []
        return [*rows, runs.comm(step, 10, 20, op="all_to_all", group="ep", tag="dispatch",
                                 bytes=int(1000 * a2a_ratio), expected_bytes=1000)]  # fmt: skip

    return state_run(runs, extra=records, model={**MODEL, **model})


BALANCED = [100, 100, 100, 100]
CASES = [
    RuleCase("MOE001", True, lambda runs: _moe(runs, BALANCED, dropped=120, a2a_ratio=0.7),
             "30% of assignments dropped", severity="high"),
    RuleCase("MOE001", False, lambda runs: _moe(runs, BALANCED), "nothing dropped"),
    RuleCase("MOE002", True, lambda runs: _moe(runs, [300, 10, 10, 10]),
             "one expert gets 3.6x the mean", severity="high"),
    RuleCase("MOE002", False, lambda runs: _moe(runs, BALANCED), "even load"),
    RuleCase("MOE002", False, lambda runs: state_run(runs), "no experts records"),
    RuleCase("MOE003", True, lambda runs: _moe(runs, [100, 100, 0, 100]), "expert 2 gets none",
             severity="high"),
    RuleCase("MOE003", False, lambda runs: _moe(runs, BALANCED), "every expert used"),
    RuleCase("MOE004", True, lambda runs: _moe(runs, BALANCED, a2a_ratio=3.0),
             "dispatch moves 3x tokens x topk x hidden x dtype", severity="high"),
    RuleCase("MOE004", False, lambda runs: _moe(runs, BALANCED, dropped=40, a2a_ratio=0.9),
             "10% fewer bytes, explained by 10% dropped"),
    RuleCase("MOE005", True, lambda runs: _moe(runs, BALANCED, aux_loss_coef=0.0),
             "aux-loss coefficient 0", severity="medium"),
    RuleCase("MOE005", True, lambda runs: _moe(runs, BALANCED, aux_loss_coef=0.5),
             "aux-loss coefficient 0.5", severity="medium"),
    RuleCase("MOE005", False, lambda runs: _moe(runs, BALANCED), "aux-loss coefficient 0.01"),
    RuleCase("MOE005", False, lambda runs: state_run(runs, model={"aux_loss_coef": 0.0}),
             "a dense model"),
]  # fmt: skip
