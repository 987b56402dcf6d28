"""The grading child's guard: an audit hook that keeps student code away from the instructor's files,
other programs and other processes (the in-process fence; a sandbox around the process can add to it)."""
from __future__ import annotations

import os
import re
import sys
import threading
from typing import Any

# Programs a student's process may start: the tools Triton and ctypes.util use on a GPU host (the C
# compiler for launcher stubs, ptxas, ldconfig to find libcuda), matched by name, e.g. gcc-12, ptxas-blackwell.
ALLOWED_PROGRAMS = re.compile(r"^([\w.]+-)*(gcc|g\+\+|cc|c\+\+|clang|clang\+\+|ld|ptxas|nvcc|ninja|ldconfig|"
                              r"nvidia-smi|uname|which)([-.][\w.]+)?$")


def install_guard(forbidden: list[str], allowed: list[str]) -> None:
    """An audit hook: no opening/listing/changing files under `forbidden` (except `allowed`), no new
    programs except compilers on ALLOWED_PROGRAMS, no signals to other processes."""
    forb = tuple(os.path.realpath(p) for p in forbidden)
    allow = tuple(os.path.realpath(p) for p in allowed)
    me = os.getpid()
    busy = threading.local()

    def inside(p: str, roots: tuple) -> bool:
        return any(p == r or p.startswith(r.rstrip(os.sep) + os.sep) for r in roots)

    def bad(path: Any) -> bool:
        if path is None or isinstance(path, int):
            return False
        try:
            p = os.path.realpath(os.fsdecode(path))
        except Exception:
            return False
        return inside(p, forb) and not inside(p, allow)

    path_events = {"open": 1, "os.listdir": 1, "os.scandir": 1, "os.link": 2, "os.rename": 2, "os.remove": 1,
                   "os.rmdir": 1, "os.mkdir": 1, "os.truncate": 1, "os.chmod": 1, "os.chown": 1, "os.utime": 1,
                   "shutil.rmtree": 1, "os.chdir": 1, "os.listxattr": 1, "os.getxattr": 1}
    never = {"os.system", "os.exec", "os.spawn", "os.fork", "os.forkpty", "pty.spawn", "os.startfile"}

    def hook(event: str, args: tuple) -> None:
        if getattr(busy, "on", False):
            return
        busy.on = True
        try:
            n = path_events.get(event)
            if n:
                for a in args[:n]:
                    if bad(a):
                        raise PermissionError(f"grading sandbox: {event} of {os.fsdecode(a)} is not allowed")
            elif event in never:
                raise PermissionError(f"grading sandbox: {event} is not allowed while grading")
            elif event in ("subprocess.Popen", "os.posix_spawn"):
                argv = args[1] if len(args) > 1 else None
                argv = [argv] if isinstance(argv, (str, bytes)) else list(argv or [])
                exe = os.path.basename(os.fsdecode(args[0] or (argv[0] if argv else "")))
                if not ALLOWED_PROGRAMS.match(exe) or any(bad(a) for a in argv if isinstance(a, (str, bytes))):
                    raise PermissionError(f"grading sandbox: starting {exe or 'a program'} is not allowed")
            elif event in ("os.kill", "os.killpg", "signal.pthread_kill") and args and args[0] not in (me, 0):
                if event != "signal.pthread_kill":
                    raise PermissionError(f"grading sandbox: {event} is not allowed")
        finally:
            busy.on = False

    sys.addaudithook(hook)
