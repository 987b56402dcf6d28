"""The notebook's side of the inference server (notebook 12): start it as a subprocess, retune it, read its metrics.

`launch(...)` runs `python -m labkit.serving.server ...`, waits until it listens and stops it on exit, even on
error; `configure`, `wait_idle` and `metrics` talk to a running one over HTTP (labkit.serving.loadgen sends it load).

Used by: notebook 12.
"""
from __future__ import annotations

import atexit
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from labkit.paths import child_env
from labkit.serving.server import DRAINED, READY


class ServerProcess:
    """A running `python -m labkit.serving.server` subprocess: `.url`, `.log()`; `.stop()` drains and ends it."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path):
        self.proc, self.url, self.log_path = proc, url, log_path

    final_log = ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else self.final_log

    @property
    def drained(self) -> bool:
        """Whether the server finished its queued requests before it exited."""
        return DRAINED in self.log()

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM (uvicorn drains in-flight requests, then exits by that signal), kill after `timeout_s`."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextlib.contextmanager
def launch(*args: str, start_timeout_s: float = 120.0) -> Iterator[ServerProcess]:
    """Start the server with command-line `args` (e.g. "--device", "cuda"), wait until it listens, stop it on exit."""
    env = child_env(PYTHONUNBUFFERED="1")
    log = Path(tempfile.mkstemp(prefix="labkit-server-", suffix=".log")[1])
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "labkit.serving.server", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
    atexit.register(_kill, proc)  # a kernel that dies mid-cell still takes its server with it
    srv = None
    try:
        deadline = time.monotonic() + start_timeout_s
        while srv is None:
            text = log.read_text(errors="replace")
            if READY in text:
                srv = ServerProcess(proc, text.split(READY, 1)[1].split()[0], log)
            elif proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {proc.returncode} before listening:\n{text[-3000:]}")
            elif time.monotonic() > deadline:
                raise TimeoutError(f"the server did not listen within {start_timeout_s:g} s:\n{text[-3000:]}")
            else:
                time.sleep(0.05)
        yield srv
    finally:
        srv = srv or ServerProcess(proc, "", log)
        srv.stop()
        srv.final_log = srv.log()
        log.unlink(missing_ok=True)
        atexit.unregister(_kill)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()


def configure(url: str, max_batch: int, max_delay_ms: float) -> dict:
    """Retune a running server's batcher (POST /config); its /metrics start afresh."""
    import httpx

    r = httpx.post(url.rstrip("/") + "/config", json={"max_batch": max_batch, "max_delay_ms": max_delay_ms},
                   trust_env=False, timeout=10)
    r.raise_for_status()
    return r.json()


def wait_idle(url: str, timeout_s: float = 10.0, settle_s: float = 0.2) -> float:
    """Wait until a running server's queue stays empty for `settle_s` (the last run's backlog is gone); seconds waited.

    A run that overloaded the server leaves it busy with requests whose clients gave up; the next run
    would measure that backlog, not its own load.
    """
    t0 = time.monotonic()
    quiet_since = None
    while time.monotonic() - t0 < timeout_s:
        now = time.monotonic()
        if metrics(url)["queue_depth"] == 0:
            quiet_since = quiet_since or now
            if now - quiet_since >= settle_s:
                break
        else:
            quiet_since = None
        time.sleep(0.02)
    return time.monotonic() - t0


def metrics(url: str) -> dict:
    """A running server's /metrics."""
    import httpx

    r = httpx.get(url.rstrip("/") + "/metrics", trust_env=False, timeout=10)
    r.raise_for_status()
    return r.json()
