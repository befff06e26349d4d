"""Bounds on what input may ask of the readers: every value that sizes an allocation or a loop.

Real runs and traces stay far inside each bound. Input beyond one is corrupt or hostile: it is
refused (InputError naming the file) or skipped with a note, never allowed to take the machine's
memory or minutes of CPU (docs/run-format.md, "Limits"). Standard library only:
`diag.contract.schema`, which the collectors import inside training processes, reads these.
"""

from __future__ import annotations

# --- the manifest and ranks -------------------------------------------------------------------
MAX_WORLD_SIZE = 2**20
"""Ranks of a run or a trace folder (the manifest's world_size, its group and rank entries, a
trace's rank and distributedInfo): ten times the largest jobs. Per-rank loops and tables are
this long."""
MAX_INTEGER = 2**62
"""Any other integer of a manifest (model sizes, memory bytes, steps completed): far above real
values, and within what int64 and float64 arithmetic on them holds."""
MISSING_RANKS_LISTED = 8
"""Missing rank files noted one by one; more are summarised in one note."""

# --- records --------------------------------------------------------------------------------------
MAX_STEP = 2**40
"""Step indices: a step a millisecond for 34 years. Keeps the integer key of a (rank, step) pair,
rank * (max step + 1) + step (diag/numeric/keys.py), inside int64."""
MAX_ABS_TIME_NS = 2**62
"""Times in ns: 146 years either side of the clock's origin; the difference of two such times
still fits in int64."""
MAX_INDEX = 2**20
"""Micro-batch, stage and chunk indices, integer labels (a layer), and the layout's counts
(micro-batches, virtual stages, gradient accumulation)."""
MAX_EXPERTS = 2**16
"""Entries of an experts record's `tokens`: the metrics' per-expert arrays are this wide."""
MAX_LABEL_CHARS = 1024
"""Labels the analysis groups by (phase, op, group, tag, layer, name, dtype, source): a kernel
or group name is under a few hundred characters."""
MAX_LINE_BYTES = 4 * 2**20
"""A rank-file line: a record is a few hundred bytes (an experts record of MAX_EXPERTS counts,
well under 1 MiB). A longer line is skipped with a note, not parsed."""
MAX_JSON_DEPTH = 64
"""Nesting of a record (an event's free fields): collectors write two or three levels. Keeps
the recursive code that handles them later (reports, caches) far from Python's recursion
limit; what is deeper than the parsers' own limit (about 1,000) they refuse."""
MAX_NOTES_PER_FILE = 16
"""Distinct reasons noted for the skipped records of one file; the others are counted in one."""

# --- profiler traces ------------------------------------------------------------------------------
GZIP_MAX_RATIO = 100
"""A compressed trace may inflate to this many times its size on disk (or to
GZIP_MIN_INFLATED_BYTES, whichever is more): the real Kineto traces of ../shared/real-traces
inflate 10 to 23 times, a gzip bomb of zeros or spaces about 1,000 times."""
GZIP_MIN_INFLATED_BYTES = 64 * 2**20
"""What any compressed trace may inflate to, however small it is on disk."""
MAX_ARG_INTEGER = 2**53
"""Element counts and correlation ids in a trace's event args: exact in a float, and a count
times an element size stays far inside int64."""
MAX_LAUNCHES_PER_KERNEL = 16
"""CPU events sharing one device event's correlation id that count it again (HTA's join of the
two on the id): real traces have one; each repeat is a row of the device-time arrays, so
without a bound n launches and n kernels on one id make n**2 rows."""

# --- PyTorch Flight Recorder dumps ----------------------------------------------------------------
MAX_FR_DUMP_BYTES = 64 * 2**20
"""A Flight Recorder dump file (JSON or pickle): PyTorch keeps 2,000 entries by default
(TORCH_FR_BUFFER_SIZE), a few MiB with their stacks. A larger file is refused, unread."""
MAX_FR_ENTRIES = 2**18
"""Entries of one dump: a hundred times the default ring buffer."""
MAX_FR_OBJECTS = 2**23
"""Values (containers and scalars, a shared one counted each time it is reached) walked in one
dump: a pickle may reference one list from many places, so its walk, unlike its file, can grow
exponentially with nesting; a dump past this is refused."""
MAX_FR_DEPTH = 16
"""Nesting of a dump: PyTorch's is five levels deep (entries, an entry, its sizes, a size)."""
