"""The per-rank-file work of a load on a Dask distributed cluster, when one machine is not enough.

`diag analyze RUN --scheduler tcp://HOST:8786` (or `DASK_SCHEDULER_ADDRESS`) sends the chunks of
rank files or profiler traces that `diag.read.parallel.map_chunks` would give local worker processes
to the cluster's workers instead: each parses its chunk from the path (the cluster's workers must
see the run's folder at the same path, as on a shared file system) and reduces it there, and only
the reduced, packed columns travel back (`diag.read.load.RankChunk`). The result is the local
analysis's exactly: the same function runs on the same chunks, in the same order.

Dask is imported here only, and this module only when a scheduler is named: a local analysis
imports nothing of Dask (tests/unit/test_dask_scheduler.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from diag.errors import InputError

Result = TypeVar("Result")
CONNECT_TIMEOUT_S = 30


def map_on_cluster(
    address: str,
    parse: Callable[[Any], Result],
    chunks: Sequence[Any],
    done: Callable[[int], None] | None = None,
) -> list[Result]:
    """`parse(chunk)` for every chunk on the cluster at `address`, results in chunk order;
    `done(index)` as each chunk's result arrives (the progress line).
    InputError (one line naming the address) when the scheduler cannot be reached or a
    task fails there."""
    try:
        from distributed import Client
    except ImportError:
        raise InputError(address, "--scheduler needs the 'distributed' package") from None
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError) as err:
        raise InputError(address, f"cannot reach the Dask scheduler ({err})") from None
    try:
        from distributed import as_completed

        # pure=False: every chunk is computed (keys never shared with another analysis)
        futures = client.map(parse, list(chunks), pure=False)
        order = {future.key: i for i, future in enumerate(futures)}
        results: list[Any] = [None] * len(futures)
        # each result is fetched as soon as it is ready and released on the cluster, so a
        # worker holds the chunk it works on, not every result it made
        for future in as_completed(futures, loop=client.loop):
            index = order[future.key]
            results[index] = future.result()
            future.release()
            if done is not None:
                done(index)
        del futures
        return results
    except (OSError, TimeoutError) as err:
        raise InputError(address, f"the Dask cluster failed ({err})") from None
    finally:
        client.close()
