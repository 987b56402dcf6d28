"""Running a grading process under limits: its environment, a wall-clock and memory watchdog, its events.

A run is `python -m MODULE IN OUT` (inside the sandbox) with IN holding what the parent wrote
(job.json, cases.pt) and OUT what the process writes back (events.jsonl, results); both are
folders the parent made. The memory watchdog counts every process below the one it started.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from labkit import proctree
from labkit.grading import safeio, seal
from labkit.paths import COURSE_ROOT


@dataclass
class Limits:
    memory_mb: int
    threads: int


def child_env(limits: Limits, scratch: Path, device: str, cuda_visible: str | None) -> dict[str, str]:
    """A small, known environment: labkit importable, caches and HOME in the student's scratch folder."""
    keep = ("PATH", "LANG", "LC_ALL", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CC", "CXX", "TERM",
            "USER", "LOGNAME", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH")
    env = {k: v for k, v in os.environ.items() if k in keep}
    pythonpath = [str(COURSE_ROOT)]
    pythonpath += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in pythonpath]
    env.update({
        "PYTHONPATH": os.pathsep.join(pythonpath), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", "HOME": str(scratch / "home"),
        "TMPDIR": str(scratch / "tmp"),
        "LABKIT_QUICK": "1", "LABKIT_DEVICE": device, "LABKIT_CACHE": str(scratch / "cache"),
        "TRITON_CACHE_DIR": str(scratch / "triton"), "TORCH_EXTENSIONS_DIR": str(scratch / "ext"),
        "OMP_NUM_THREADS": str(limits.threads), "MKL_NUM_THREADS": str(limits.threads), "MALLOC_ARENA_MAX": "2",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",  # torch.compile in this process: its worker pool would start programs
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


PAGE = os.sysconf("SC_PAGE_SIZE")
MAX_OUT_BYTES = 512 * 2**20  # results and events a run may leave in its out folder
MAX_OUT_ENTRIES = 10000  # files and folders in it
EVENTS_CAP = 4 * 2**20  # progress events read from one run, at most
MAX_LOG_BYTES = 64 * 2**20  # what a run may print (stdout and stderr, kept in run/log.txt)
MAX_INODES = 100_000  # files and folders a run may make in its private /tmp and /dev/shm (tmpfs)


def pin_tree(root: int, cpus: list[int] | None) -> str | None:
    """Every process from `root` down set back to `cpus` where its affinity left them: the grading child pins
    itself, and student code can widen its own (one call), so the parent holds it from outside. The incident to
    record when one had widened it, else None."""
    if not cpus:
        return None
    widened, want = False, set(cpus)
    for pid in [root, *proctree.below(root)]:
        try:  # each thread has its own affinity (a thread's widening is its own, and threads started later inherit it)
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except (OSError, ValueError):
            tids = [pid]
        for tid in tids:
            try:
                if os.sched_getaffinity(tid) - want:
                    os.sched_setaffinity(tid, cpus)
                    widened = True
            except OSError:  # gone meanwhile (ProcessLookupError), not ours to set (PermissionError)
                continue
    return (f"your process widened its CPU affinity; it was pinned back to cores {sorted(cpus)} (a worker's cores "
            f"are its own)") if widened else None


def hold_cores(root: int, cpus: list[int] | None, incidents: list[str] | None) -> None:
    """pin_tree, its incident added to `incidents` once (the same words each time)."""
    if (widened := pin_tree(root, cpus)) and incidents is not None and widened not in incidents:
        incidents.append(widened)


def _pinned_start(argv: list[str], cpus: list[int] | None, **kwargs) -> subprocess.Popen:
    """Popen with the new process already on `cpus`: it inherits the affinity of the thread that starts it (this
    one, set meanwhile), so no process of its tree, the sandbox's own included, ever starts outside them."""
    if not cpus:
        return subprocess.Popen(argv, **kwargs)
    saved = os.sched_getaffinity(0)  # this thread's (Linux: pid 0 is the calling thread)
    os.sched_setaffinity(0, cpus)
    try:
        return subprocess.Popen(argv, **kwargs)
    finally:
        os.sched_setaffinity(0, saved)


def tree_rss_mb(root: int) -> float:
    """Resident memory of `root` and every process below it (what a student started, sandboxed or not), plus
    what they wrote into the sandbox's private tmpfs (/tmp, /dev/shm): files there are memory too."""
    procs = proctree.table()
    pids = [root, *proctree.below(root, procs)]
    return (sum(procs.get(pid, (0, 0))[1] for pid in pids) * PAGE + scratch_usage(pids)[0]) / 2**20


def scratch_usage(pids: list[int]) -> tuple[int, int]:
    """(bytes, inodes) used in the private /tmp and /dev/shm of the sandboxes these processes live in (seen
    through /proc/PID/root; the host's own folders are not counted)."""
    host = set()
    for mount in ("/tmp", "/dev/shm"):
        try:
            host.add(os.stat(mount).st_dev)
        except OSError:
            pass
    seen, used, inodes = set(), 0, 0
    for pid in pids:
        for mount in ("tmp", "dev/shm"):
            path = f"/proc/{pid}/root/{mount}"
            try:
                dev = os.stat(path).st_dev
                if dev in host or dev in seen:
                    continue
                v = os.statvfs(path)
            except OSError:
                continue
            seen.add(dev)
            used += (v.f_blocks - v.f_bfree) * v.f_frsize
            inodes += v.f_files - v.f_ffree
    return used, inodes


def _over_limits(proc, out_dir: Path, log_fd: int, limits: Limits, ticks: int) -> str | None:
    """Why the run must stop now (None: it may go on); memory every 0.3 s, files every second."""
    if ticks % 3 == 0 and tree_rss_mb(proc.pid) > limits.memory_mb:
        return (f"ran out of memory: the process used more than {limits.memory_mb} MB (files in /tmp and /dev/shm "
                f"count as memory) and was stopped")
    if ticks % 10:
        return None
    if os.fstat(log_fd).st_size > MAX_LOG_BYTES:
        return f"stopped: it printed more than {MAX_LOG_BYTES // 2**20} MB"
    if scratch_usage(proctree.below(proc.pid, proctree.table()))[1] > MAX_INODES:
        return f"stopped: it made more than {MAX_INODES} files in /tmp and /dev/shm"
    if safeio.tree_bytes(out_dir, MAX_OUT_ENTRIES) > MAX_OUT_BYTES:
        return (f"stopped: it wrote more than {MAX_OUT_BYTES // 2**20} MB or {MAX_OUT_ENTRIES} files and folders "
                f"into its results folder")
    return None


def launch(box, module: str, run: Path, work: Path, env: dict, limits: Limits, budget: float,
           nb_timeout: float | None, key: str, labkit_copy: Path | None = None,
           feed: dict[str, bytes] | None = None, rounds=None, cpus: list[int] | None = None,
           incidents: list[str] | None = None) -> tuple[list[dict], str | None, int | None]:
    """Run `python -m module IN OUT` in `box` under the limits; (its events, why it was killed, exit code).

    run/in is the job (written by the parent), run/out the only host folder the process can write,
    run/log.txt its output. Events are read as they grow, never more than EVENTS_CAP bytes. `key`
    goes to the process on stdin (labkit.grading.seal). `labkit_copy`: the labkit it sees (grading.strip).
    `feed`: notebook -> its hidden cases (torch.save bytes), sent on stdin once, only when the process asks for
    them (a `cases` event, after the notebook's cells ran): they are never a file in the sandbox.
    `rounds`: a labkit.grading.rounds.Driver, which times the rounds the process serves (its `rounds` events).
    `cpus`: the worker's cores, which the process starts on and is held to on every tick (pin_tree); what it did
    to widen them goes to `incidents`.
    """
    out_dir = run / "out"
    out_dir.mkdir(parents=True)
    events_path = out_dir / "events.jsonl"
    os.close(os.open(events_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    reader = safeio.EventReader(events_path, cap=EVENTS_CAP)
    argv, cwd = box.command(module, run / "in", out_dir, env, work, labkit_copy)
    with open(run / "log.txt", "xb") as logf:
        proc = _pinned_start(argv, cpus, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=logf,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             pass_fds=() if rounds is None else (rounds.write_fd,))
        if rounds is not None:
            rounds.started()
        try:
            proc.stdin.write(key.encode() + b"\n")
            proc.stdin.flush()
            if not feed:
                proc.stdin.close()
        except OSError:  # it died before reading: its exit code says why
            pass
        sent: set[str] = set()
        started = time.monotonic()
        killed, nb_started, ticks = None, None, 0
        while proc.poll() is None:
            time.sleep(0.1)
            ticks += 1
            now = time.monotonic()
            hold_cores(proc.pid, cpus, incidents)
            new = reader.poll()
            if any(ev.get("ev") == "nb_start" for ev in new):
                nb_started = now
            for ev in new:
                if rounds is not None:
                    rounds.on_event(ev, proc)
                if feed and ev.get("ev") == "cases" and ev.get("nb") in feed and ev["nb"] not in sent:
                    sent.add(ev["nb"])
                    threading.Thread(target=_send, args=(proc.stdin, seal.frame(feed[ev["nb"]])), daemon=True).start()
            if reader.flooded:
                killed = (f"stopped: its progress log was flooded (more than {EVENTS_CAP // 2**20} MB; only the "
                          f"grader writes there)")
            elif now - started > budget:
                killed = f"timed out: the process ran past its {budget:.0f} s limit"
            elif nb_timeout is not None and nb_started is not None and now - nb_started > nb_timeout:
                killed = f"timed out: the notebook ran past its {nb_timeout:g} s limit"
            else:
                killed = _over_limits(proc, out_dir, logf.fileno(), limits, ticks)
            if killed:
                break
        # Still running (stopped here; not reaped, so the pid is still its own): everything below it, stopped first
        # so none forks past the kill, while it still holds them (without a sandbox keeper.py keeps what was
        # detached there). One that ended took its leftovers with it (keeper.py; bwrap's PID namespace). Then its
        # group.
        if proc.returncode is None:
            proctree.kill_tree(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        rc = box.exit_code(proc.wait())
        if rounds is not None:  # its pipe has ended: a round in progress stops now
            rounds.finish()
        try:
            proc.stdin.close()
        except (OSError, ValueError):
            pass
    events = reader.drain()
    reader.close()
    if reader.flooded and killed is None:
        killed = f"its progress log was flooded (more than {EVENTS_CAP // 2**20} MB; only the grader writes there)"
    return events, killed, rc


def _send(pipe, data: bytes) -> None:
    """Write to the process's stdin from a thread of its own: a process that never reads cannot stall the watchdog."""
    try:
        pipe.write(data)
        pipe.flush()
    except (OSError, ValueError):
        pass


def log_tail(log: Path, lines: int = 6) -> str:
    """The last few non-empty lines of a run's output (the file's end only is read)."""
    text = safeio.tail(log, 4000)
    return "\n".join([ln for ln in text.splitlines() if ln.strip()][-lines:])
