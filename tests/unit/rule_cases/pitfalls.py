"""Cases for the pitfalls family (no collapse pattern)."""

from __future__ import annotations

from typing import Any

from rule_cases import RuleCase
from rule_cases._state_runs import event, state_run

EIGHT = (100.0,) * 8


def _epochs(runs: Any, set_epoch: bool) -> Any:
    def rows(rank: int, step: int) -> list[Any]:
        if step % 4:
            return []
        digest = f"r{rank}e{step // 4}" if set_epoch else f"r{rank}"
        return [event(step, "epoch", epoch=step // 4, order_hash=digest, samples=16)]

    return state_run(runs, EIGHT, extra=rows)


def _norms(runs: Any, local: float, total: float | None, **layout: Any) -> Any:
    def rows(rank: int, step: int) -> list[Any]:
        return [event(step, "grad_norm", local=local, max_norm=1.0, clipped=True,
                      **{"global": total})]  # fmt: skip

    return state_run(runs, extra=rows, layout=layout)


def _losses(runs: Any, bad_from: int | None) -> Any:
    def rows(rank: int, step: int) -> list[Any]:
        return []

    run_dir = state_run(runs, EIGHT, ranks=1, extra=rows)
    if bad_from is None:
        return run_dir
    path = run_dir / "rank-00000.jsonl"
    lines = path.read_text().splitlines()
    fixed = [
        line.replace('"loss": 1.0', '"loss": NaN') if f'"step": {bad_from}' in line else line
        for line in lines
    ]
    path.write_text("\n".join(fixed) + "\n")
    return run_dir


def _grad_sync(
    runs: Any, synced: bool, checksums_differ: bool = False, tag: str | None = "grad"
) -> Any:
    def rows(rank: int, step: int) -> list[Any]:
        out: list[Any] = []
        if step == 0:
            out.append(event(0, "grad_sync", wrapper="ddp", group="dp", group_size=2, tag=tag))
        if synced:
            out.append(runs.comm(step, 50.0, 60.0, tag="grad", expected_bytes=1000))
        if step % 2 == 0:
            drift = 1.0 + 0.01 * step if checksums_differ else 1.0
            out.append(event(step, "param_checksum", group="dp", values=[1.0, drift]))
        return out

    return state_run(runs, EIGHT, extra=rows)


CASES = [
    RuleCase("PIT001", True, lambda runs: _epochs(runs, False),
             "same order hash in both epochs", severity="medium", ranks=(0, 1)),
    RuleCase("PIT001", False, lambda runs: _epochs(runs, True), "a new order every epoch"),
    RuleCase("PIT002", True, lambda runs: _norms(runs, 0.6, 1.0, zero_stage=3),
             "local norms 60% of the global one", severity="low", ranks=(0, 1)),
    RuleCase("PIT002", True, lambda runs: _norms(runs, 0.6, None, zero_stage=3),
             "ZeRO-3 records only local norms", severity="medium", ranks=(0, 1)),
    RuleCase("PIT002", False, lambda runs: _norms(runs, 1.0, 1.0), "DP: local equals global"),
    RuleCase("PIT003", True, lambda runs: _losses(runs, 5), "loss NaN at step 5",
             severity="high", ranks=(0,)),
    RuleCase("PIT003", False, lambda runs: _losses(runs, None), "finite losses"),
    RuleCase("PIT004", True, lambda runs: _grad_sync(runs, synced=False),
             "DDP on 2 ranks, no gradient all-reduce", severity="high", ranks=(0, 1)),
    RuleCase("PIT004", True, lambda runs: _grad_sync(runs, synced=True, checksums_differ=True),
             "weights drift apart", severity="high", ranks=(0, 1)),
    RuleCase("PIT004", False, lambda runs: _grad_sync(runs, synced=True),
             "gradients all-reduced, equal checksums"),
    RuleCase("PIT004", False, lambda runs: _grad_sync(runs, synced=False, tag=None),
             "a sync diag could not record (the user's hook came first)"),
]  # fmt: skip
