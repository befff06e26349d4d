"""The divisors of a GPU count (or an expert count) from its prime factors, not a loop to n:
`--gpus 1000000000` is 2^9 x 5^9, 100 divisors found in microseconds, where trying each
number up to n took minutes.

Factors by trial division up to a small bound, then Pollard's rho (Brent's variant) with a
Miller-Rabin primality test for what is left, so even a count of 19 digits factors at once.
"""

from __future__ import annotations

import math
from functools import lru_cache

TRIAL_BOUND = 1000
"""Primes below this are divided out one by one; rho finds the larger ones."""

_WITNESSES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
"""Miller-Rabin bases that make the test exact below 3.3e24 (and all but certain above)."""


def is_prime(n: int) -> bool:
    """Miller-Rabin over `_WITNESSES`."""
    if n < 2:
        return False
    for p in _WITNESSES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _WITNESSES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int) -> int:
    """A non-trivial factor of the odd composite `n` (Brent 1980)."""
    for c in range(1, n):
        y, m, g, r, q = 2, 128, 1, 1, 1
        x = ys = y
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(m, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g = math.gcd(q, n)
                k += m
            r *= 2
        if g == n:  # the batch overshot: step back one at a time
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = math.gcd(abs(x - ys), n)
        if g != n:
            return g
    raise AssertionError(f"no factor of {n} found")  # unreachable for a composite n


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of `n` >= 1."""
    assert n >= 1, n
    factors: dict[int, int] = {}
    for p in range(2, TRIAL_BOUND):
        if p * p > n:
            break
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if is_prime(m):
            factors[m] = factors.get(m, 0) + 1
        else:
            f = _rho(m)
            stack += [f, m // f]
    return dict(sorted(factors.items()))


@lru_cache(maxsize=1024)
def divisors(n: int, limit: int | None = None) -> tuple[int, ...]:
    """The divisors of `n` >= 1 (at most `limit` when given), ascending."""
    out = [1]
    for p, k in prime_factors(n).items():
        out = [d * p**e for d in out for e in range(k + 1) if limit is None or d * p**e <= limit]
    return tuple(sorted(out))
