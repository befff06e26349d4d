"""Errors a user can cause (unusable input), as opposed to bugs."""

from __future__ import annotations

import os


class InputError(Exception):
    """Unusable input: `path` names the file or folder, `reason` says what is wrong with it.

    `str()` is one line, "PATH: reason", which the CLI prints after "diag: error: ".
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = str(path)
        self.reason = " ".join(str(reason).split())
        super().__init__(self.path, self.reason)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"
