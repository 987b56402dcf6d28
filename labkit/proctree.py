"""The processes below one, from Linux's /proc: to watch their memory or to stop them all."""
from __future__ import annotations

import os
import signal
import time


def table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, resident pages) of every process readable now (empty where there is no /proc)."""
    return _table(_stats())


def _stats() -> dict[int, list[bytes]]:
    """pid -> the fields of its /proc/PID/stat (_stat), of every process readable now."""
    try:
        names = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return {}
    out = {}
    for name in names:
        try:
            out[int(name)] = _stat(int(name))
        except OSError:  # gone meanwhile
            continue
    return out


def _table(stats: dict[int, list[bytes]]) -> dict[int, tuple[int, int]]:
    out = {}
    for pid, fields in stats.items():
        try:
            out[pid] = (int(fields[1]), int(fields[21]))
        except (ValueError, IndexError):
            continue
    return out


def _stat(pid: int) -> list[bytes]:
    """The fields of /proc/PID/stat after the command (which may hold spaces and ')'): state, parent pid, ..."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rfind(b")") + 2:].split()


def below(root: int, procs: dict[int, tuple[int, int]] | None = None) -> list[int]:
    """Every process below `root` (not `root` itself), in `procs` (default: read now)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in (table() if procs is None else procs).items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        kids = [k for k in children.get(todo.pop(), []) if k != root and k not in found]
        found += kids
        todo += kids
    return found


def processes(root: int) -> list[int]:
    """`root` and every process below it."""
    return [root, *below(root)]


def signal_tree(root: int, sig: int, include_root: bool = True) -> None:
    """`sig` to `root` (unless not `include_root`) and every process below it, again until no new one appears (one
    may fork meanwhile)."""
    done: set[int] = set()
    for _ in range(20):
        todo = [p for p in (processes(root) if include_root else below(root)) if p not in done]
        if not todo:
            return
        for pid in todo:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            done.add(pid)


def kill_tree(root: int, include_root: bool = True) -> None:
    """SIGKILL to `root` (unless not `include_root`) and every process below it, all stopped (SIGSTOP) first, so
    none forks past the kill."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        signal_tree(root, sig, include_root)


def _cpu_ticks(fields: list[bytes] | None) -> tuple[int, int] | None:
    """(own user + system, reaped children's user + system) clock ticks, from a process's /proc/PID/stat fields."""
    try:
        return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    except (TypeError, ValueError, IndexError):
        return None


def cpu_seconds(root: int) -> float:
    """CPU time (user + system, seconds) of `root` and every process below it: each one's threads, exited ones
    included (its CPU clock, to the nanosecond), and the children it reaped (to the clock tick). /proc is read
    once."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    stats = _stats()
    for pid in [root, *below(root, _table(stats))]:
        if (ticks := _cpu_ticks(stats.get(pid))) is None:
            continue  # gone meanwhile
        try:
            own = time.clock_gettime_ns((~pid << 3) | 2) / 1e9  # the process's CPU clock (clock_getcpuclockid)
        except OSError:
            own = ticks[0] / tick
        total += own + ticks[1] / tick
    return total
