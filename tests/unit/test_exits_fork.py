"""A process recorded by the collectors forks workers (a multiprocessing pool, as diag's own
replay does): SIGTERM must end a worker at once and never run the parent's flush. Before, a
worker kept the collectors' handler and shared the parent's wakeup pipe: its SIGTERM woke the
parent's flush, and a pool's `terminate` could wait on workers that did not end (a suite run
hung 300 s in `Pool.__exit__`). Run in a fresh interpreter: the handler is once per process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from collectors import exits

    flushed = []
    exits.install(lambda exc, tb: None, lambda signum: flushed.append(signum))
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    time.sleep(0.2)
    started = time.perf_counter()
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    elapsed = time.perf_counter() - started
    time.sleep(0.5)  # the parent's wakeup thread, had the child's signal reached it
    print(json.dumps({"elapsed_s": elapsed, "by_sigterm": os.WIFSIGNALED(status)
                      and os.WTERMSIG(status) == signal.SIGTERM, "flushed": flushed}))
    """
)


def test_a_forked_child_ends_on_sigterm_at_once_and_leaves_the_parent_alone() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["by_sigterm"], result
    assert result["elapsed_s"] < 1.0, result  # not the parent's 2 s wait for a flush
    assert result["flushed"] == [], result  # the child's signal never woke the parent's flush
