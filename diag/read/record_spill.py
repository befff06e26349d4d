"""A large run's spans and collectives of every step, for a reader that needs them all but one
chunk of steps at a time (the attribution's replay of every step, `diag analyze --replay all`).

A large run keeps whole records only in its window of first steps (`record_window.py`). To
read the others without holding them, the rank files are parsed once more, by the loader's
worker processes, and each worker writes the records of each chunk of steps of its rank files
to a scratch folder (Arrow IPC, only the columns asked for); `chunk(i)` reads chunk i's parts
back as two tables, the loader's dtypes. The scratch folder goes when the `with` block ends.
Memory: a worker's rank files (as when loading) and one chunk read back. The workers are this
machine's processes even when the load used a Dask cluster: the folder is local.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from types import TracebackType

import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather

from diag.contract.schema import RecordKind
from diag.rankfile.records import Packed, concat
from diag.read import record_window
from diag.read.load import KEPT_COLUMNS, RunData, frame_of, rank_files, read_rank_file
from diag.read.parallel import map_chunks
from diag.read.scratch import owned_folder

SPILLED_KINDS = (RecordKind.SPAN.value, RecordKind.COMM.value)
PREFIX, NAMES = "diag-records-", r"\d+-\d+-[a-z]+\.arrow"
"""The scratch folders' prefix (scratch.py) and the only files they hold (`_name`)."""


class SpilledRecords:
    """The spans and collectives of `run` in chunks of steps (`bounds`), written to a scratch
    folder on entering and read back by `chunk(index)`; `columns`: the columns kept by kind."""

    def __init__(self, run: RunData, bounds: Sequence[range], columns: dict[str, list[str]]):
        self.run, self.bounds, self.columns = run, list(bounds), columns
        self.folder: Path | None = None
        self.parts: list[int] = []
        self._scratch = contextlib.ExitStack()

    def __enter__(self) -> SpilledRecords:
        # removed on the way out, or by the next analysis when this one is killed (scratch.py)
        self.folder = self._scratch.enter_context(owned_folder(PREFIX, NAMES))
        try:
            files = list(rank_files(self.run.path, self.run.manifest.world_size).items())
            from diag.rankfile import arrow_fast  # rank files only (a lazy import)

            arrow_fast.prepare()  # before the workers fork: they inherit it loaded
            write = partial(_spill, bounds=self.bounds, columns=self.columns, folder=self.folder)
            self.parts = map_chunks(write, files, cluster=False)  # the folder is this machine's
        except BaseException:
            self._scratch.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._scratch.close()

    def chunk(self, index: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The spans and the collectives of the steps of chunk `index`, in rank-file order."""
        assert self.folder is not None, "used outside its `with` block"
        tables = []
        for kind in SPILLED_KINDS:
            parts = [_read(self.folder / _name(index, first, kind)) for first in self.parts]
            frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
            for name in frame.columns:  # parts with different labels concatenate to objects
                if any(isinstance(part[name].dtype, pd.CategoricalDtype) for part in parts):
                    frame[name] = frame[name].astype("category")
            tables.append(frame)
        return tables[0], tables[1]


def _name(index: int, first_rank: int, kind: str) -> str:
    return f"{index:05d}-{first_rank:06d}-{kind}.arrow"


def _read(path: Path) -> pd.DataFrame:
    return feather.read_table(path, memory_map=False).to_pandas()


def _spill(
    files: list[tuple[int, Path]], bounds: list[range], columns: dict[str, list[str]], folder: Path
) -> int:
    """(In a worker) parse some rank files and write their records of each chunk of steps;
    returns the first rank, which names its parts."""
    per_file = [read_rank_file(rank, path).columns for rank, path in files]
    for index, steps in enumerate(bounds):
        for kind in SPILLED_KINDS:
            windowed = [record_window.in_window(c[kind], steps) for c in per_file if kind in c]
            packed: dict[str, Packed] = {
                name: concat([table[name] for table in windowed]) for name in KEPT_COLUMNS[kind]
            }
            frame = frame_of(kind, packed)[columns[kind]]
            table = pa.Table.from_pandas(frame, preserve_index=False)
            feather.write_feather(table, folder / _name(index, files[0][0], kind),
                                  compression="uncompressed")  # fmt: skip
    return files[0][0]
