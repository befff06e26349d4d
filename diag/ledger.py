"""The communication and memory ledger: the seed formulas as pure functions (SEED-DIGEST).

Units are in the names: `_bytes`, `_fraction`. Nothing here reads files or touches torch.
"""

from __future__ import annotations


def bus_factor(op: str, group_size: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw x factor, algbw = size / time.

    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; others 1
    (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
    """
    n = max(int(group_size), 1)
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0
