"""A test-only stand-in for `torchrun --standalone` that imports torch once: the launcher imports
torch and the trainer's module, then forks one process per rank (each its own process, with
its own process group over a TCP store on localhost, as under torchrun). On 2 cores the import
is most of a small job's time: torchrun and every rank import torch anew (a 4-rank job: five
imports, ~2 s of CPU each); here it is one.

    python forkrun.py NPROC MODULE [ARGS...]   # MODULE: reference_runs.dp, tests.distributed.x

Each rank gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, GROUP_RANK) and runs MODULE as `__main__` with ARGS, then its exit
handlers (the collectors flush there). As torchrun does, the first rank to fail gets the others
a SIGTERM (then a SIGKILL after a grace period); the exit code is the first failure's, else 0.

What `diag run` adds on top of torchrun (its preflight, DIAG_COMMAND in the manifest) is
tested on real `diag run` launches (tests/distributed/test_dp_run.py, test_readme_snippet.py,
tests/unit/test_launch.py); tests that only need a trainer's run directory use this.
"""

from __future__ import annotations

import atexit
import importlib
import os
import runpy
import signal
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 10.0
"""How long the other ranks get to flush after their SIGTERM (torchrun waits 30 s)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_main(module: str, args: list[str], rank: int, world: int, port: int) -> None:
    """The rank's process: torchrun's environment, MODULE as __main__, then its exit handlers;
    never returns."""
    code: int = 0
    try:
        os.environ.update(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", ROLE_RANK=str(rank),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        )  # fmt: skip
        sys.argv = [module, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        atexit._run_exitfuncs()
    except BaseException:  # the rank's own error: its traceback, exit 1 (torchrun's too)
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def launch(module: str, args: list[str], world: int) -> int:
    port = free_port()
    pids: list[int] = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            rank_main(module, args, rank, world, port)
        pids.append(pid)
    running, failure, stop_at = set(pids), 0, None
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:  # none ended: polled, so that the grace period below can run out
            if stop_at is not None and time.monotonic() > stop_at:
                for other in running:
                    os.kill(other, signal.SIGKILL)
            time.sleep(0.05)
            continue
        running.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and failure == 0:  # as torchrun: the first failure ends the job
            failure = code if code > 0 else 128 - code
            for other in running:
                os.kill(other, signal.SIGTERM)
            stop_at = time.monotonic() + GRACE_S
    return failure


def main() -> None:
    world, module, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it (ranks share the cores)
    sys.path.insert(0, str(ROOT))  # tests.distributed.* as well as the installed packages
    import torch  # noqa: F401  (before the forks: every rank inherits it)

    import collectors  # noqa: F401  (every job the tests launch records with them)

    # the module's imports too; the module itself runs again, as __main__, in every rank
    importlib.import_module(module)
    del sys.modules[module]
    sys.stdout.flush()
    sys.exit(launch(module, args, world))


if __name__ == "__main__":
    main()
