"""What a run directory holds (diag/read/load.py reads it): its manifest, checked, and the rank
file of each rank, with notes for the files it skips; or why it is no run directory."""

from __future__ import annotations

import itertools
from pathlib import Path

from diag.contract import schema
from diag.contract.limits import MAX_INDEX, MISSING_RANKS_LISTED
from diag.contract.schema import Manifest
from diag.errors import InputError
from diag.rankfile.arrow_format import SUFFIX
from diag.rankfile.arrow_format import rank_file_name as arrow_rank_file_name

_LAYOUT_INTS = ("dp", "tp", "pp", "ep", "cp", "microbatches", "virtual_stages", "grad_accum")
KINETO_PATTERNS = ("*.pt.trace.json", "*.pt.trace.json.gz")


def file_mtimes(rank_files: dict[int, Path]) -> dict[int, float]:
    """Each rank file's modification time (whether records still arrive: the run's status)."""
    found = {}
    for rank, path in rank_files.items():
        try:
            found[rank] = path.stat().st_mtime
        except OSError:
            continue
    return found


def load_manifest(run_dir: Path) -> Manifest:
    if not run_dir.exists():
        raise InputError(run_dir, "no such file or directory")
    if not run_dir.is_dir():
        raise InputError(run_dir, "is a file, not a run directory (a folder with manifest.json)")
    manifest_path = run_dir / schema.MANIFEST_FILE
    if not manifest_path.exists():
        if any(any(run_dir.glob(pattern)) for pattern in KINETO_PATTERNS):
            raise InputError(
                run_dir,
                "has files named like profiler traces (*.pt.trace.json[.gz]) but no "
                "manifest.json: a run directory needs one, and a trace folder is read as one "
                "when its files hold traceEvents",
            )
        below = _runs_below(run_dir)
        if below:
            shown = ", ".join(f"{name}/" for name in below[:4]) + (" ..." if len(below) > 4 else "")
            raise InputError(
                run_dir,
                f"holds no run itself but {len(below)} below it ({shown}): name one, or "
                f"compare them with `diag compare`",
            )
        from diag.read.kineto.trace_folder import why_no_traces  # only on this error's path

        why = why_no_traces(run_dir)
        raise InputError(
            run_dir,
            "has neither manifest.json nor Kineto traces (*.pt.trace.json[.gz])"
            + (f": {why}" if why else ""),
        )
    try:
        manifest = schema.read_manifest(run_dir)
    except schema.SchemaError as err:
        raise InputError(manifest_path, str(err)) from None
    except UnicodeDecodeError:
        raise InputError(manifest_path, "not valid JSON (not UTF-8 text)") from None
    except OSError as err:
        raise InputError(manifest_path, f"cannot read ({err.strerror or err})") from None
    for name in _LAYOUT_INTS:
        value = getattr(manifest.layout, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INDEX
        ):
            raise InputError(
                manifest_path,
                f"layout.{name} is {schema.shown(value)}, expected an integer in 1..{MAX_INDEX:,}",
            )
    return manifest


_MAX_LISTED_BELOW = 1000  # entries looked at one level down, so a huge folder costs no more


def _runs_below(folder: Path) -> list[str]:
    """Names of the folders directly below `folder` that hold a run (a manifest) or profiler
    traces: what a user who named their parent (a before/after pair, a sweep) meant."""
    # its package imports the loader: imported late
    from diag.read.kineto.trace_folder import is_trace_dir

    try:
        entries = sorted(itertools.islice(folder.iterdir(), _MAX_LISTED_BELOW))
    except OSError:
        return []
    found = []
    for entry in entries:
        try:
            if entry.is_dir() and ((entry / schema.MANIFEST_FILE).exists() or is_trace_dir(entry)):
                found.append(entry.name)
        except (OSError, InputError):
            continue  # unreadable: not a run anyone can name
    return found


def rank_files(run_dir: Path, world_size: int) -> dict[int, Path]:
    """The rank file of each rank of a run directory, as the loader picks them (its notes
    dropped: a reader after the load, which noted them)."""
    return rank_files_noted(run_dir, world_size, [])


def rank_files_noted(run_dir: Path, world_size: int, skipped: list[str]) -> dict[int, Path]:
    """The rank file of each rank found (the canonical name when two name one rank); notes
    for files outside the world, second files of a rank and missing ranks."""
    found: dict[int, Path] = {}
    for file in sorted(run_dir.iterdir(), key=lambda f: (f.name != _canonical(f.name), f.name)):
        match = schema.RANK_FILE_RE.match(file.name)
        if not match:
            continue
        rank = int(match.group(1))
        if rank >= world_size:
            skipped.append(
                f"{file.name}: rank {rank} is outside the world of {world_size}, ignored"
            )
        elif rank in found:
            skipped.append(f"{file.name}: a second file of rank {rank} (after "
                           f"{found[rank].name}), ignored")  # fmt: skip
        else:
            found[rank] = file
    if not found:
        raise InputError(
            run_dir,
            f"no rank files (rank-NNNNN.arrows or rank-NNNNN.jsonl) for ranks "
            f"0..{world_size - 1} of the world",
        )
    missing = [r for r in range(world_size) if r not in found]
    suffix = rank_file_suffix(list(found.values()))
    if len(missing) <= MISSING_RANKS_LISTED:
        for rank in missing:
            name = schema.rank_file_name(rank, suffix)
            skipped.append(f"{name}: missing (rank {rank} of {world_size} not analysed)")
    else:
        names = ", ".join(schema.rank_file_name(r, suffix) for r in missing[:3])
        skipped.append(f"{names} and {len(missing) - 3} more: missing ({len(missing)} of "
                       f"{world_size} ranks not analysed)")  # fmt: skip
    return found


def rank_file_suffix(files: list[Path]) -> str:
    """The suffix most of a run's rank files have (a missing rank's file would have it)."""
    arrows = sum(file.name.endswith(SUFFIX) for file in files)
    return SUFFIX if 2 * arrows > len(files) else schema.RANK_FILE_SUFFIX


def _canonical(name: str) -> str:
    """The name the writer gives the rank a file name holds (rank-00001.jsonl for
    rank-000001.jsonl, rank-00001.arrows for rank-000001.arrows); the name itself when it
    holds none."""
    match = schema.RANK_FILE_RE.match(name)
    if not match:
        return name
    rank = int(match.group(1))
    return arrow_rank_file_name(rank) if name.endswith(SUFFIX) else schema.rank_file_name(rank)
