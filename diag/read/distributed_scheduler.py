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

import contextlib
from collections.abc import Callable, Iterator, Sequence
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
    client = _connected(address)
    try:
        # pure=False: every chunk is computed (keys never shared with another analysis)
        return _fetched(client, client.map(parse, list(chunks), pure=False), done)
    except (OSError, TimeoutError) as err:
        raise InputError(address, f"the Dask cluster failed ({err})") from None
    finally:
        client.close()


def _connected(address: str) -> Any:
    """A client of the scheduler at `address`; InputError naming it when there is none."""
    try:
        from distributed import Client
    except ImportError:
        raise InputError(address, "--scheduler needs the 'distributed' package") from None
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError) as err:
        raise InputError(address, f"cannot reach the Dask scheduler ({err})") from None


def _fetched(client: Any, futures: list[Any], done: Callable[[int], None] | None) -> list[Any]:
    """The futures' results in their order, each fetched as soon as it is ready and released
    on the cluster, so a worker holds the chunk it works on, not every result it made."""
    from distributed import as_completed

    order = {future.key: i for i, future in enumerate(futures)}
    results: list[Any] = [None] * len(futures)
    for future in as_completed(futures, loop=client.loop):
        index = order[future.key]
        results[index] = future.result()
        future.release()
        if done is not None:
            done(index)
    del futures
    return results


class KeptOnCluster:
    """Results kept on the cluster's workers that made them, for later work there (issue 43):
    a large trace folder's packed records stay with the worker that parsed each trace (in its
    memory, or on its disk where Dask spills it) while the client infers the layout from what
    `summary` hands back, then each trace is reduced by a task on the worker that holds it
    (Dask runs a task where its input is) and only the reduction comes back. Everything kept
    is released when the block of `kept_on_cluster` ends (or the client goes: the scheduler
    forgets a lost client's data)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.client = _connected(address)
        self.kept: list[Any] = []

    def map(
        self,
        parse: Callable[[Any], Any],
        chunks: Sequence[Any],
        summary: Callable[[Any, int], Result],
        done: Callable[[int], None] | None = None,
    ) -> list[Result]:
        """`parse(chunk)` for every chunk on the cluster, each result kept where it was made
        (the chunk's index names it from now on); `summary(result, index)` of each, computed
        there too, is what comes back, in chunk order."""
        try:
            self.kept = self.client.map(parse, list(chunks), pure=False)
            summaries = self.client.map(summary, self.kept, range(len(self.kept)), pure=False)
            return _fetched(self.client, summaries, done)
        except (OSError, TimeoutError) as err:
            raise InputError(self.address, f"the Dask cluster failed ({err})") from None
        except RuntimeError as err:
            # a task that reads another's result is read by the scheduler itself: it must
            # import diag as the workers do (Dask asks one environment of all three)
            if "deserializ" not in str(err):
                raise
            raise InputError(self.address, "the Dask scheduler cannot read diag's tasks: "
                             "install diag where the scheduler runs") from None  # fmt: skip

    def apply(
        self,
        work: Callable[[Any, Any], Result],
        items: Sequence[tuple[int, Any]],
        done: Callable[[int], None] | None = None,
    ) -> list[Result]:
        """`work(kept result, argument)` for each (index, argument) of `items`, on the worker
        holding that result; the answers in the order of `items`."""
        try:
            futures = [
                self.client.submit(work, self.kept[index], argument, pure=False)
                for index, argument in items
            ]
            return _fetched(self.client, futures, done)
        except (OSError, TimeoutError) as err:
            raise InputError(self.address, f"the Dask cluster failed ({err})") from None

    def fetch(self, index: int) -> Any:
        """The kept result `index` itself, brought here."""
        try:
            return self.kept[index].result()
        except (OSError, TimeoutError) as err:
            raise InputError(self.address, f"the Dask cluster failed ({err})") from None

    def close(self) -> None:
        self.kept = []
        self.client.close()


@contextlib.contextmanager
def kept_on_cluster(address: str) -> Iterator[KeptOnCluster]:
    """A `KeptOnCluster` of the scheduler at `address`, released when the block ends."""
    kept = KeptOnCluster(address)
    try:
        yield kept
    finally:
        kept.close()
