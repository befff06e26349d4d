"""`diag run`'s check before torchrun starts: parse a trainer's options and plan its layout as
the trainer itself will (`plan(cfg, world_size)`, reference_runs/common.py `Plan`), in a process
of its own, so that `diag` never imports the trainers.

    python -m reference_runs.preflight TRAINER WORLD_SIZE [trainer options...]

Exits 0, silent, when the trainer can run; 2 when it cannot, with argparse's usage error for a
bad option or one line `diag: error: REASON` for an impossible layout, on stderr.
"""

from __future__ import annotations

import importlib
import sys

from diag.contract.names import TRAINERS
from reference_runs.common import checked_plan
from reference_runs.config import parse_config


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in TRAINERS or not argv[1].isdigit():
        sys.exit(f"usage: python -m reference_runs.preflight {{{','.join(TRAINERS)}}} "
                 "WORLD_SIZE [trainer options...]")  # fmt: skip
    trainer, world_size, args = argv[0], int(argv[1]), argv[2:]
    module = importlib.import_module(f"reference_runs.{trainer}")
    cfg = parse_config(args, trainer)  # argparse: the usage error, exit 2
    checked_plan(module.plan, cfg, world_size, prog="diag", say=True)


if __name__ == "__main__":
    main(sys.argv[1:])
