"""`python keeper.py CMD...`: run CMD as a child and keep every process it starts below this one.

Without a sandbox (--unsafe-no-sandbox) nothing else does: a process a student's code detaches (a double fork,
setsid) would leave the tree the grader walks, and so run on while the baseline is timed, outside the CPU time
counted for the student and past the end of the grading. As a child subreaper (Linux) this process adopts such
orphans instead of init, as the sandbox's own PID namespace does. When CMD exits, whatever it left is killed, and
this exits as CMD did (128 + N for signal N, as bubblewrap does). Standard library only: it is run as a file, not
imported through labkit (which imports torch).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # linux/prctl.h


def _proctree():
    """labkit/proctree.py, loaded from its file (importing it as labkit.proctree would import torch)."""
    spec = importlib.util.spec_from_file_location("_keeper_proctree", Path(__file__).resolve().parents[1] /
                                                  "proctree.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def adopt_orphans() -> bool:
    """Make this process the reaper of its descendants' orphans, and die with its parent; False where Linux's
    prctl is not there."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
    except (OSError, AttributeError):
        return False


def exit_status(status: int) -> int:
    """A wait status as a shell (and bubblewrap) reports it: the exit code, or 128 + N for signal N."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: keeper.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    if not adopt_orphans():
        print("labkit grade: this system has no child subreaper (Linux prctl): a process a student detaches is "
              "not followed", file=sys.stderr)
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    status = 0
    while True:
        try:
            got, st = os.waitpid(-1, 0)
        except ChildProcessError:  # (a signal's interruption is retried by Python itself)
            break
        if got == pid:
            status = st
            _proctree().kill_tree(os.getpid(), include_root=False)
    return exit_status(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
