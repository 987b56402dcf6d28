"""Running a grading process under limits: its environment, a wall-clock and memory watchdog, its events.

A run is `python -m MODULE IN OUT` with IN holding what the parent wrote (job.json, cases.pt) and
OUT what the process writes back (events.jsonl, results); both are folders the parent owns.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.paths import COURSE_ROOT


@dataclass
class Limits:
    memory_mb: int
    threads: int


def child_env(limits: Limits, scratch: Path, device: str, cuda_visible: str | None) -> dict[str, str]:
    """A small, known environment: labkit importable, caches and HOME in the student's scratch folder."""
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CC", "CXX", "TERM",
            "USER", "LOGNAME", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH")
    env = {k: v for k, v in os.environ.items() if k in keep}
    pythonpath = [str(COURSE_ROOT)]
    pythonpath += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in pythonpath]
    env.update({
        "PYTHONPATH": os.pathsep.join(pythonpath), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", "HOME": str(scratch / "home"),
        "LABKIT_QUICK": "1", "LABKIT_DEVICE": device, "LABKIT_CACHE": str(scratch / "cache"),
        "TRITON_CACHE_DIR": str(scratch / "triton"), "TORCH_EXTENSIONS_DIR": str(scratch / "ext"),
        "OMP_NUM_THREADS": str(limits.threads), "MKL_NUM_THREADS": str(limits.threads), "MALLOC_ARENA_MAX": "2",
    })
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif cuda_visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible
    return env


def signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def read_events(path: Path) -> list[dict]:
    """The JSON objects, one per line, a process wrote so far (a torn last line is skipped)."""
    events = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return events
    for line in text.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict):
            events.append(ev)
    return events


def launch(module: str, in_dir: Path, out_dir: Path, log: Path, cwd: Path, env: dict, limits: Limits,
           budget: float, nb_timeout: float | None) -> tuple[list[dict], str | None, int | None]:
    """Run `python -m module IN OUT` under the limits; (its events, why it was killed, exit code)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    events_path = out_dir / "events.jsonl"
    with open(log, "wb") as logf:
        proc = subprocess.Popen([sys.executable, "-m", module, str(in_dir), str(out_dir)], cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True)
        started = time.monotonic()
        killed, nb_started, seen = None, None, 0
        while proc.poll() is None:
            time.sleep(0.1)
            now = time.monotonic()
            if nb_timeout is not None:
                events = read_events(events_path)
                if len(events) > seen:
                    if any(ev.get("ev") == "nb_start" for ev in events[seen:]):
                        nb_started = now
                    seen = len(events)
            if now - started > budget:
                killed = f"timed out: the process ran past its {budget:.0f} s limit"
            elif nb_started is not None and now - nb_started > nb_timeout:
                killed = f"timed out: the notebook ran past its {nb_timeout:g} s limit"
            elif _rss_mb(proc.pid) > limits.memory_mb:
                killed = f"ran out of memory: the process used more than {limits.memory_mb} MB and was stopped"
            if killed:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                break
        rc = proc.wait()
        try:  # anything it left behind in its process group
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return read_events(events_path), killed, rc


def log_tail(log: Path, lines: int = 6) -> str:
    try:
        text = log.read_bytes()[-4000:].decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join([ln for ln in text.splitlines() if ln.strip()][-lines:])
