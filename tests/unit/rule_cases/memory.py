"""Cases for the memory family (pattern 5)."""

from __future__ import annotations

from typing import Any

from rule_cases import RuleCase
from rule_cases._state_runs import event, state_run

MB = 1_000_000


def _mem(runs: Any, budget: int | None, activations: int, state: int = MB) -> Any:
    def mem(rank: int, step: int) -> list[Any]:
        return [runs.mem(step, params=state // 4, grads=state // 4, optimizer=state // 2,
                         activations=activations, comm_buffers=MB // 10)]  # fmt: skip

    hardware = {"device_memory_bytes": budget} if budget else {}
    return state_run(runs, extra=mem, hardware=hardware)


def _oom(runs: Any) -> Any:
    def rows(rank: int, step: int) -> list[Any]:
        if rank != 1 or step != 2:
            return []
        return [event(2, "oom", message="CUDA out of memory", params=MB, grads=MB,
                      optimizer=2 * MB, activations=9 * MB, comm_buffers=0)]  # fmt: skip

    return state_run(runs, extra=rows)


CASES = [
    RuleCase("MEM001", True, lambda runs: _mem(runs, 2 * MB, 3 * MB),
             "4.1 MB measured on a 2 MB device, activations dominate",
             severity="high", ranks=(0, 1)),
    RuleCase("MEM001", False, lambda runs: _mem(runs, 100 * MB, 3 * MB), "4% of the budget"),
    RuleCase("MEM001", False, lambda runs: _mem(runs, None, 3 * MB), "no budget declared"),
    RuleCase("MEM002", True, _oom, "rank 1 ran out of memory", severity="high", ranks=(1,)),
    RuleCase("MEM002", False, lambda runs: _mem(runs, None, MB), "no oom event"),
    RuleCase("MEM003", True, lambda runs: _mem(runs, 5 * MB, 3 * MB),
             "82% of the budget: activation-bound", severity="low", ranks=(0,)),
    RuleCase("MEM003", False, lambda runs: _mem(runs, 50 * MB, 3 * MB), "8% of the budget"),
]  # fmt: skip
