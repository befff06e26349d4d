"""Opening what a run directory or a trace folder holds: regular files only, sizes bounded.

Every reader of input goes through `open_regular` or `read_regular`, so that a FIFO, a device
(`/dev/zero`, `/dev/urandom`), a socket or a folder where a file belongs is refused at once and
a file is never read past its bound, whatever its size says (a `/proc` file says 0 and never
ends; a sparse file says 64 GiB). The file is opened without blocking (opening a FIFO for
reading waits for a writer) and checked on the opened descriptor (`fstat`), so nothing can be
swapped in between the check and the read. Standard library only: the manifest's reader
(`diag.contract.schema`) uses it inside training processes.

The refusals are `NotReadable`, an `OSError` whose `strerror` is the reason, so a reader's
`except OSError as err: ... f"cannot read ({err.strerror})"` says it in its one line.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

READ_CHUNK_BYTES = 2**20
"""What a file that reports no size (or grows while read) is read by."""
GROWTH_BYTES = 16 * 2**20
"""What a file may grow by past its size while it is read (a rank file being written: a poll
of a collector's writes); more is a file whose size does not say what it holds."""


class NotReadable(OSError):
    """A file a reader refuses before reading it: not a regular file, or over its bound."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(errno.EINVAL, reason, str(path))


def kind_of(mode: int) -> str:
    """What a file that is not regular is, in words."""
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symbolic link"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def size_words(size_bytes: int) -> str:
    if size_bytes >= 2**30:
        return f"{size_bytes / 2**30:.1f} GiB"
    if size_bytes >= 2**20:
        return f"{size_bytes / 2**20:.1f} MiB"
    return f"{size_bytes:,} bytes"


def open_regular(
    path: str | os.PathLike[str], max_bytes: int, *, follow_links: bool = True
) -> BinaryIO:
    """The file opened for reading (unbuffered) when it is a regular file of at most
    `max_bytes` by its size; NotReadable otherwise, OSError when it cannot be opened. A
    symbolic link is followed to what it names (a run may link its files from elsewhere)
    unless `follow_links` is False (the cache: a link there is refused, ELOOP)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise NotReadable(path, f"{kind_of(status.st_mode)}, not a regular file")
        if status.st_size > max_bytes:
            raise NotReadable(
                path,
                f"{size_words(status.st_size)}, over the {size_words(max_bytes)} a file of its "
                "kind may be",
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def read_regular(
    path: str | os.PathLike[str], max_bytes: int, *, follow_links: bool = True
) -> bytes:
    """The whole of a regular file of at most `max_bytes`, read once: what its size says in one
    read, then whatever follows (a file that says 0, or grows) a chunk at a time, refused as
    soon as it passes `max_bytes`."""
    with open_regular(path, max_bytes, follow_links=follow_links) as fh:
        size = os.fstat(fh.fileno()).st_size
        return b"".join(regular_chunks(fh, path, max_bytes, first_bytes=size))


def regular_chunks(
    fh: BinaryIO,
    path: str | os.PathLike[str],
    max_bytes: int,
    *,
    first_bytes: int = 0,
    chunk_bytes: int = READ_CHUNK_BYTES,
) -> Iterator[bytes]:
    """An opened regular file (`open_regular`) a chunk at a time: `first_bytes` in one read
    (its size, to read it whole), then `chunk_bytes` at a time, refused (NotReadable) as soon
    as it passes `max_bytes`, or what was read first plus GROWTH_BYTES: a file being written
    grows a little while read, a `/proc` file that says 0 goes on. The one bounded read of
    input files, whole (`read_regular`) or streamed."""
    # NOTE: diag/read/kineto/stream.py's `inflated` still reads a plain trace with a loop of
    # its own, bounded only by the size `open_regular` checked: it should iterate this one
    # (left to that module's rewrite, which another change owns, to keep the merge clean)
    size, have = os.fstat(fh.fileno()).st_size, 0
    if first_bytes > 0:
        first = fh.read(first_bytes)
        have = len(first)
        if first:
            yield first
    bound = min(max_bytes, (have if first_bytes > 0 else size) + GROWTH_BYTES)
    while chunk := fh.read(chunk_bytes):
        have += len(chunk)
        if have > bound:
            raise NotReadable(
                path,
                f"goes on past {size_words(bound)} as it is read, more than its size says "
                f"({size_words(os.fstat(fh.fileno()).st_size)}; a /proc file?) or the "
                f"{size_words(max_bytes)} a file of its kind may be",
            )
        yield chunk


def read_regular_text(path: str | os.PathLike[str], max_bytes: int) -> str:
    """`read_regular` decoded as UTF-8 (UnicodeDecodeError on other bytes)."""
    return read_regular(path, max_bytes).decode("utf-8")


def is_regular(path: Path) -> bool:
    """Whether `path` names a regular file (after links), without opening it."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except (OSError, ValueError):
        return False
