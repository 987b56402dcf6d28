"""`labkit grade SUBMISSIONS --out DIR`: grade students' exercise notebooks, each student in its own process.

The parent (this process) loads the instructor's graded tests (solutions/graded/*.py), makes their
hidden cases from a seed and computes the expected results itself. A child process per student
runs the student's code cells (extracted here with nbformat), calls the student's functions on the
case inputs it is handed and saves what they returned; the parent compares. So nothing a student
redefines or monkeypatches in the child can change the comparison, and outputs cached for the
visible checks fail on the hidden cases. The child runs in an empty directory, under per-cell and
per-exercise time limits (SIGALRM), a per-notebook time limit and a memory limit enforced from the
parent (RLIMIT_AS on the CPU, an RSS watchdog always), with an audit hook that refuses to open the
solutions, the graded tests, other submissions or the output folder, and to start other programs.
grades.csv and feedback/<student>.md are written once every child has finished.
"""
from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

COURSE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SEED = 20250601
NEEDS_GPU = "needs GPU"
MAX_RESULT_BYTES = 256 * 2**20
# Programs a student's process may start: the tools Triton and ctypes.util use on a GPU host (the C
# compiler for launcher stubs, ptxas, ldconfig to find libcuda), matched by name, e.g. gcc-12, ptxas-blackwell.
ALLOWED_PROGRAMS = re.compile(r"^([\w.]+-)*(gcc|g\+\+|cc|c\+\+|clang|clang\+\+|ld|ptxas|nvcc|ninja|ldconfig|"
                              r"nvidia-smi|uname|which)([-.][\w.]+)?$")


# ---------------------------------------------------------------------------------------------
# The instructor's graded tests

@dataclass
class FnSpec:
    """One graded function: its notebook, points, hidden cases and how it is run."""

    notebook: str
    name: str
    points: float
    make_cases: Callable
    needs_gpu: bool = False
    requires_triton: bool = False
    stage2: str | None = None
    cases: list[dict] = field(default_factory=list)


def load_specs(graded_dir: Path) -> dict[str, list[FnSpec]]:
    """notebook name -> its graded functions, from graded_dir/NN_topic.py (no bytecode left behind)."""
    specs: dict[str, list[FnSpec]] = {}
    for path in sorted(graded_dir.glob("[0-9]*.py")):
        module = types.ModuleType(f"labkit_graded_{path.stem}")
        module.__file__ = str(path)
        exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
        exercises = getattr(module, "EXERCISES", None)
        if not isinstance(exercises, dict) or not exercises:
            raise ValueError(f"{path} defines no EXERCISES dict")
        specs[path.stem] = [FnSpec(path.stem, name, float(d.get("points", 1)), d["cases"], bool(d.get("needs_gpu")),
                                   bool(d.get("requires_triton")), d.get("stage2"))
                            for name, d in exercises.items()]
    if not specs:
        raise ValueError(f"no graded tests (NN_topic.py files) in {graded_dir}")
    return specs


def default_seed(graded_dir: Path) -> int:
    path = graded_dir / "SEED"
    return int(path.read_text().split()[0]) if path.exists() else DEFAULT_SEED


def make_cases(spec: FnSpec, seed: int, gpu: bool) -> list[dict]:
    import torch

    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(spec.name.encode())) % 2**62)
    return spec.make_cases(g, gpu)


# ---------------------------------------------------------------------------------------------
# Submissions: one folder or one notebook per student

def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "student"


def find_submissions(root: Path) -> list[tuple[str, list[Path]]]:
    """(student, notebooks) for each folder or .ipynb directly inside `root`."""
    found, taken = [], set()
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            nbs = sorted(p for p in entry.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
            name = entry.name
        elif entry.suffix == ".ipynb":
            nbs, name = [entry], entry.stem
        else:
            continue
        student = safe_name(name)
        while student in taken:
            student += "_"
        taken.add(student)
        found.append((student, nbs))
    return found


def _read_notebook(path: Path) -> dict:
    try:
        import nbformat
        return nbformat.read(str(path), as_version=4)
    except ImportError:
        return json.loads(path.read_text(encoding="utf-8"))


def _src(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def match_notebooks(paths: list[Path], names: list[str]) -> tuple[dict[str, Path], list[str]]:
    """Which submitted notebook is which exercise: by the metadata `labkit exercises build` wrote, else by name."""
    matched: dict[str, Path] = {}
    notes = []
    for path in paths:
        try:
            meta = _read_notebook(path).get("metadata", {}).get("labkit", {}).get("exercise")
        except Exception:
            meta = None
        stem = path.stem
        name = meta if meta in names else next(
            (n for n in names if n == stem), None) or next((n for n in names if n in stem), None) or next(
            (n for n in names if re.match(r"\d\d", stem) and n[:2] == stem[:2]), None)
        if name is None:
            notes.append(f"{path.name}: not one of the graded notebooks, ignored")
        elif name in matched:
            notes.append(f"{path.name}: a second notebook for {name}, ignored (graded {matched[name].name})")
        else:
            matched[name] = path
    return matched, notes


def extract_code(path: Path) -> tuple[list[list], list[str]]:
    """[code cell number, source] of each code cell; shell/magic lines become `pass` (with a note)."""
    nb = _read_notebook(path)
    cells, notes, number = [], [], 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        number += 1
        src = _src(cell)
        if src.lstrip().startswith("%%"):
            notes.append(f"code cell {number} skipped: a cell magic ({src.strip().splitlines()[0][:60]}); "
                         f"the grader runs plain Python only")
            continue
        lines = []
        for line in src.splitlines():
            stripped = line.lstrip()
            if stripped.startswith(("!", "%")):
                indent = line[: len(line) - len(stripped)]
                lines.append(f"{indent}pass")
                notes.append(f"code cell {number}: skipped the line `{stripped[:60]}`: the grader runs plain "
                             f"Python, not IPython magics or shell lines (use subprocess.run for commands)")
            else:
                lines.append(line)
        cells.append([number, "\n".join(lines) + "\n"])
    return cells, notes


def defines_triton_kernel(cells: list[list]) -> bool:
    """A function decorated with triton.jit (or jit) somewhere in the notebook (checked statically)."""
    for _, src in cells:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    text = ast.unparse(dec)
                    if re.match(r"^(triton\.)?jit\b", text):
                        return True
    return False


# ---------------------------------------------------------------------------------------------
# Results

@dataclass
class Outcome:
    points: float
    score: float | None = 0.0  # None: not graded here (needs a GPU)
    status: str = "not submitted"
    messages: list[str] = field(default_factory=list)


@dataclass
class StudentReport:
    student: str
    outcomes: dict[str, Outcome]
    notes: list[str] = field(default_factory=list)
    incidents: list[str] = field(default_factory=list)  # time-outs and deaths: also in the CSV
    missing: list[str] = field(default_factory=list)  # graded notebooks not submitted
    seconds: float = 0.0


@dataclass
class Context:
    specs: dict[str, list[FnSpec]]
    timeout: float
    exercise_timeout: float
    memory_mb: int
    gpu: bool
    cuda_build: bool
    forbidden: list[str]
    workroot: Path
    threads: int
    gpu_slots: Any = None  # queue of CUDA_VISIBLE_DEVICES values


def _signal_name(rc: int) -> str:
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


def _read_events(path: Path) -> list[dict]:
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


def _child_env(ctx: Context, work: Path, device: str, cuda_visible: str | None) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CC", "CXX", "TERM",
            "USER", "LOGNAME", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH")
    env = {k: v for k, v in os.environ.items() if k in keep}
    pythonpath = [str(Path(__file__).resolve().parent.parent)]
    pythonpath += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in pythonpath]
    env.update({
        "PYTHONPATH": os.pathsep.join(pythonpath), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", "HOME": str(work / "home"),
        "LABKIT_QUICK": "1", "LABKIT_DEVICE": device, "LABKIT_CACHE": str(work / "cache"),
        "TRITON_CACHE_DIR": str(work / "triton"), "TORCH_EXTENSIONS_DIR": str(work / "ext"),
        "OMP_NUM_THREADS": str(ctx.threads), "MKL_NUM_THREADS": str(ctx.threads), "MALLOC_ARENA_MAX": "2",
    })
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif cuda_visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible
    return env


def _launch(ctx: Context, work: Path, job: dict, tag: str, env: dict, budget: float, nb_timeout: float | None
            ) -> tuple[list[dict], str | None, int | None]:
    """Run one child (`--child` or `--stage2`) under the limits; (its events, why it was killed, exit code)."""
    job_path = work / f"job-{tag}.json"
    events_path = work / f"events-{tag}.jsonl"
    job["events"] = str(events_path)
    job_path.write_text(json.dumps(job))
    mode = "--stage2" if job.get("stage2") else "--child"
    with open(work / f"log-{tag}.txt", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "labkit.grade", mode, str(job_path)], cwd=work / "cwd",
                                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        started = time.monotonic()
        killed, nb_started, seen = None, None, 0
        while proc.poll() is None:
            time.sleep(0.1)
            now = time.monotonic()
            if nb_timeout is not None:
                events = _read_events(events_path)
                if len(events) > seen:
                    if any(ev.get("ev") == "nb_start" for ev in events[seen:]):
                        nb_started = now
                    seen = len(events)
            if now - started > budget:
                killed = f"timed out: the process ran past its {budget:.0f} s limit"
            elif nb_started is not None and now - nb_started > nb_timeout:
                killed = f"timed out: the notebook ran past its {nb_timeout:g} s limit"
            elif _rss_mb(proc.pid) > ctx.memory_mb:
                killed = f"ran out of memory: the process used more than {ctx.memory_mb} MB and was stopped"
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
    return _read_events(events_path), killed, rc


def _log_tail(work: Path, tag: str, lines: int = 6) -> str:
    try:
        text = (work / f"log-{tag}.txt").read_bytes()[-4000:].decode("utf-8", "replace")
    except OSError:
        return ""
    keep = [ln for ln in text.splitlines() if ln.strip()][-lines:]
    return "\n".join(keep)


def _load_results(path: Path) -> tuple[list | None, str | None]:
    import torch

    if not path.exists():
        return None, None
    if path.stat().st_size > MAX_RESULT_BYTES:
        return None, "its results were too large to read"
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:
        return None, f"its results could not be read ({type(exc).__name__})"
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        return None, "its results were malformed"
    return data["cases"], None


def _judge(spec: FnSpec, results: list | None, reason: str | None) -> Outcome:
    from labkit.check import compare

    out = Outcome(spec.points)
    if results is None:
        out.status, out.messages = "failed", [reason or "no result (the function was never graded)"]
        return out
    passed, failures = 0, []
    for i, case in enumerate(spec.cases):
        r = results[i] if i < len(results) and isinstance(results[i], dict) else {"error": "no result"}
        if "obs" in r:
            problems = compare(case["expected"], r["obs"], case.get("rtol", 0.0), case.get("atol", 0.0))
        elif r.get("timeout"):
            problems = ["timed out: stopped at the exercise's time limit"]
        else:
            problems = [str(r.get("error") or "no result")[:400]]
        if problems:
            failures.append((case["about"], "; ".join(problems)))
        else:
            passed += 1
    if failures and passed == 0 and len({p for _, p in failures}) == 1:  # the same reason every time
        out.messages.append(f"on all {len(failures)} case(s): {failures[0][1]}")
    else:
        out.messages += [f"on {about}: {p}" for about, p in failures[:3]]
        if len(failures) > 3:
            out.messages.append(f"... and {len(failures) - 3} more case(s) failed")
    failed = len(failures)
    out.score = round(spec.points * passed / max(len(spec.cases), 1), 2)
    out.status = "ok" if failed == 0 else ("partial" if passed else "failed")
    return out


def grade_student(ctx: Context, index: int, student: str, paths: list[Path]) -> StudentReport:
    """Grade one student's notebooks in child processes; never raises for anything the student did."""
    import torch

    t0 = time.monotonic()
    names = list(ctx.specs)
    matched, notes = match_notebooks(paths, names)
    report = StudentReport(student, {s.name: Outcome(s.points) for nb in names for s in ctx.specs[nb]}, notes)
    work = ctx.workroot / f"{index:04d}"
    for sub in ("cwd", "home", "results", "cache", "triton", "ext"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    jobs, cases_args = [], {}
    for nb in names:
        for s in ctx.specs[nb]:
            if s.needs_gpu and not ctx.cuda_build:
                report.outcomes[s.name] = Outcome(s.points, None, NEEDS_GPU,
                                                  ["needs a CUDA GPU and nvcc: not graded on this machine"])
        if nb not in matched:
            report.missing.append(nb)
            continue
        try:
            cells, cell_notes = extract_code(matched[nb])
        except Exception as exc:
            for s in ctx.specs[nb]:
                report.outcomes[s.name] = Outcome(s.points, 0.0, "failed", [f"could not read {matched[nb].name}: {exc}"])
            continue
        report.notes += [f"{nb}: {n}" for n in cell_notes]
        fns = []
        for s in ctx.specs[nb]:
            if s.needs_gpu and not ctx.cuda_build:
                continue
            elif s.requires_triton and not defines_triton_kernel(cells):
                report.outcomes[s.name] = Outcome(s.points, 0.0, "failed", [
                    f"no @triton.jit kernel in {matched[nb].name}: {s.name} must run a Triton kernel you wrote"])
            else:
                fns.append(s.name)
                cases_args[s.name] = ([{"args": {}}] if s.stage2 else [{"args": c["args"]} for c in s.cases])
        jobs.append({"name": nb, "cells": cells, "functions": fns})
    torch.save(cases_args, work / "cases.pt")

    cuda_visible = ctx.gpu_slots.get() if ctx.gpu_slots is not None else None
    try:
        device = "cuda" if ctx.gpu else "cpu"
        env = _child_env(ctx, work, device, cuda_visible)
        died: dict[str, str] = {}  # function -> why it has no result
        remaining, launch = [j for j in jobs if j["functions"]], 0
        while remaining:
            launch += 1
            job = {"workdir": str(work), "notebooks": remaining, "device": device,
                   "cell_timeout": ctx.exercise_timeout, "exercise_timeout": ctx.exercise_timeout,
                   "memory_mb": ctx.memory_mb, "rlimit_as": device == "cpu", "threads": ctx.threads,
                   "forbidden": ctx.forbidden + [str(ctx.workroot)], "allowed": [str(work)]}
            budget = 120 + ctx.timeout * len(remaining)
            events, killed, rc = _launch(ctx, work, job, str(launch), env, budget, ctx.timeout)
            done = {ev.get("nb") for ev in events if ev.get("ev") == "nb_done"}
            started = [ev.get("nb") for ev in events if ev.get("ev") == "nb_start"]
            for ev in events:
                if ev.get("ev") == "cell_error" and ev.get("nb") in {j["name"] for j in remaining}:
                    report.notes.append(f"{ev['nb']}: code cell {ev.get('cell')} {str(ev.get('error'))[:300]}")
            if all(j["name"] in done for j in remaining):
                break
            current = next((n for n in reversed(started) if n not in done), None)
            why = killed or (f"the process was killed by {_signal_name(rc)}" if rc is not None and rc < 0 else
                             f"the process ended early (exit code {rc}: os._exit, or a crash)")
            if current is None:  # died before running any notebook it was given
                tail = _log_tail(work, str(launch))
                for j in remaining:
                    for fn in j["functions"]:
                        died[fn] = f"the grading process failed before running {j['name']}: {why}" + (
                            f"\n    {tail}" if tail else "")
                break
            where, crashed_fn = "", None
            for ev in reversed(events):
                if ev.get("nb") != current:
                    continue
                if ev.get("ev") == "cell_start":
                    where = f" while running code cell {ev.get('cell')}"
                    break
                if ev.get("ev") == "fn_start":
                    where, crashed_fn = f" while grading {ev.get('fn')}", ev.get("fn")
                    break
            job_of = next(j for j in remaining if j["name"] == current)
            after = remaining[[j["name"] for j in remaining].index(current) + 1:]
            if crashed_fn in job_of["functions"]:  # run the notebook again for the functions after it
                died[crashed_fn] = f"{why}{where}"
                rest = job_of["functions"][job_of["functions"].index(crashed_fn) + 1:]
                remaining = ([dict(job_of, functions=rest)] if rest else []) + after
            else:  # it died in a code cell: the notebook's functions get no result
                for fn in job_of["functions"]:
                    died.setdefault(fn, f"{why}{where}")
                remaining = after
            report.incidents.append(f"{current}: {why}{where}")

        for nb in jobs:
            for fn in nb["functions"]:
                spec = next(s for s in ctx.specs[nb["name"]] if s.name == fn)
                results, problem = _load_results(work / "results" / f"{fn}.pt")
                if results is None:
                    report.outcomes[fn] = _judge(spec, None, problem or died.get(fn))
                elif spec.stage2:
                    report.outcomes[fn] = _stage2(ctx, work, spec, results, env)
                else:
                    report.outcomes[fn] = _judge(spec, results, None)
                if fn in died and results is not None and report.outcomes[fn].status != "ok":
                    report.outcomes[fn].messages.append(died[fn])
    finally:
        if ctx.gpu_slots is not None:
            ctx.gpu_slots.put(cuda_visible)
    report.notes = list(dict.fromkeys(report.notes))  # a notebook run again repeats its cells' notes
    report.incidents = list(dict.fromkeys(report.incidents))
    report.seconds = time.monotonic() - t0
    return report


def _stage2(ctx: Context, work: Path, spec: FnSpec, results: list, env: dict) -> Outcome:
    """Build and run the CUDA source the student's function returned, in a clean process with no student Python."""
    first = results[0] if results and isinstance(results[0], dict) else {}
    if "obs" not in first:
        return _judge(spec, None, str(first.get("error") or ("timed out" if first.get("timeout") else "no result")))
    src = first["obs"].get("source") if isinstance(first["obs"], dict) else None
    if not isinstance(src, str) or "__global__" not in src or "scale_kernel" not in src:
        return _judge(spec, None, "expected a string of CUDA C defining `__global__ void scale_kernel(...)`")
    import torch

    torch.save([{"args": c["args"]} for c in spec.cases], work / f"{spec.name}-stage2.pt")
    job = {"stage2": spec.stage2, "workdir": str(work), "source": src, "cases": str(work / f"{spec.name}-stage2.pt"),
           "result": str(work / "results" / f"{spec.name}-stage2.pt"), "name": f"grade_{work.name}_{spec.name}"}
    events, killed, rc = _launch(ctx, work, job, f"{spec.name}-stage2", env, ctx.timeout + 300, None)
    results2, problem = _load_results(Path(job["result"]))
    if results2 is None:
        why = problem or killed or f"the build/run process ended with code {rc}"
        tail = _log_tail(work, f"{spec.name}-stage2", 8)
        return _judge(spec, None, why + (f"\n    {tail}" if tail else ""))
    return _judge(spec, results2, None)


# ---------------------------------------------------------------------------------------------
# The child: runs a student's code. Everything before `install_guard` happens before student code.

class ExerciseTimeout(BaseException):
    """Raised by SIGALRM when a cell or an exercise runs past its time limit."""


def _on_alarm(signum, frame):
    raise ExerciseTimeout()


def _set_alarm(seconds: float) -> None:
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.0))


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


def _stub_check_module():
    """What `labkit.check` is inside the grader: every check a no-op (the grader never uses them)."""
    mod = types.ModuleType("labkit.check", "The checks do nothing while grading: the grader has its own tests.")

    def noop(*args, **kwargs):
        return None

    def getattr_(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return noop

    mod.__getattr__ = getattr_
    return mod


_describe_error: Callable[[BaseException], str] = lambda exc: f"raised {type(exc).__name__}: {exc}"


def _describe(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, ExerciseTimeout):
        return f"timed out after {timeout:g} s"
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    if isinstance(exc, KeyboardInterrupt):
        return "raised KeyboardInterrupt"
    return _describe_error(exc)


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def child_main(job_path: str) -> None:
    import builtins
    import linecache
    import resource

    job = json.loads(Path(job_path).read_text())
    work = Path(job["workdir"])
    events_fd = os.open(job["events"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def emit(**ev) -> None:
        os.write(events_fd, (json.dumps(ev) + "\n").encode())

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["memory_mb"] * 2**20,) * 2)  # output and files it writes

    import torch

    import labkit
    import labkit.check as real_check

    labkit.setup(device=job["device"], quick=True)
    torch.set_num_threads(max(1, int(job.get("threads", 1))))
    try:
        import triton  # noqa: F401  (before the guard: importing it may look for compilers)
        import triton.language  # noqa: F401
    except ImportError:
        pass
    cases = torch.load(work / "cases.pt", weights_only=True)
    if job["device"] == "cpu":  # 'meta' stands in for a GPU: its first op imports for seconds, not the student's time
        torch.ones(2, 2, dtype=torch.bool, device="meta").tril()
    if job["device"] == "cuda" and any(fn == "median_ms" for nb in job["notebooks"] for fn in nb["functions"]):
        real_check.calibrate_gpu_sleep()
    callers = dict(real_check.CALLERS)
    if job.get("rlimit_as"):  # address space beyond what torch and triton mapped on import (not with CUDA)
        extra = _vm_size() + job["memory_mb"] * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (extra, extra))
    global _describe_error
    _describe_error = real_check.describe_error
    save, replace = torch.save, os.replace
    stub = _stub_check_module()
    sys.modules["labkit.check"] = stub
    labkit.check = stub
    signal.signal(signal.SIGALRM, _on_alarm)
    install_guard(job["forbidden"], job["allowed"])

    def display(*objs, **kwargs):
        print(*objs)

    for nb in job["notebooks"]:
        emit(ev="nb_start", nb=nb["name"])
        ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins, "display": display}
        for number, src in nb["cells"]:
            emit(ev="cell_start", nb=nb["name"], cell=number)
            filename = f"<{nb['name']} code cell {number}>"
            linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
            try:
                _set_alarm(job["cell_timeout"])
                exec(compile(src, filename, "exec"), ns)
                _set_alarm(0)
            except BaseException as exc:  # SystemExit and timeouts too: the notebook goes on
                _set_alarm(0)
                emit(ev="cell_error", nb=nb["name"], cell=number, error=_describe(exc, job["cell_timeout"]))
        for fn_name in nb["functions"]:
            emit(ev="fn_start", nb=nb["name"], fn=fn_name)
            fn, out = ns.get(fn_name), []
            todo = cases.get(fn_name, [])
            if not callable(fn):
                why = (f"{fn_name} is not defined in the notebook (was it renamed, or did its cell fail?)"
                       if fn is None else f"{fn_name} is not a function (it is a {type(fn).__name__})")
                out = [{"error": why} for _ in todo]
            else:
                try:
                    _set_alarm(job["exercise_timeout"])
                    for case in todo:
                        try:
                            out.append({"obs": callers[fn_name](fn, case["args"])})
                        except ExerciseTimeout:
                            raise
                        except BaseException as exc:
                            out.append({"error": _describe(exc, job["exercise_timeout"])})
                    _set_alarm(0)
                except ExerciseTimeout:
                    _set_alarm(0)
                    out += [{"timeout": True}] * (len(todo) - len(out))
            tmp = work / "results" / f".{fn_name}.tmp"
            try:
                save({"cases": out}, tmp)
            except BaseException as exc:
                save({"cases": [{"error": f"its output could not be saved: {_describe(exc, 0)}"}] * len(todo)}, tmp)
            replace(tmp, work / "results" / f"{fn_name}.pt")
            emit(ev="fn_done", nb=nb["name"], fn=fn_name)
        emit(ev="nb_done", nb=nb["name"])
    sys.stdout.flush()
    os._exit(0)  # skip anything the student registered to run at exit


def stage2_main(job_path: str) -> None:
    """Build a student's CUDA source with the instructor's wrapper and run it on the hidden inputs."""
    import torch

    from labkit.check import build_scale_extension, describe_error, snapshot

    job = json.loads(Path(job_path).read_text())
    cases = torch.load(job["cases"], weights_only=True)
    out: list[dict] = []
    try:
        ext = build_scale_extension(job["source"], name=job["name"], build_dir=str(Path(job["workdir"]) / "ext" / "b"))
    except Exception as exc:
        lines = [ln for ln in str(exc).splitlines() if "error" in ln.lower()][:6]
        msg = "the kernel did not compile: " + (" | ".join(lines) or str(exc)[:500])
        out = [{"error": msg} for _ in cases]
    else:
        for case in cases:
            try:
                got = ext.scale(case["args"]["x"].cuda(), float(case["args"]["alpha"]))
                torch.cuda.synchronize()
                out.append({"obs": snapshot(got)})
            except Exception as exc:
                out.append({"error": describe_error(exc)})
    torch.save({"cases": out}, job["result"])
    sys.stdout.flush()
    os._exit(0)


# ---------------------------------------------------------------------------------------------
# Reports

def _fmt_points(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def write_reports(out_dir: Path, reports: list[StudentReport], columns: list[FnSpec], device: str) -> None:
    """grades.csv (one row per student) and feedback/<student>.md, each written atomically."""
    (out_dir / "feedback").mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".grades.csv.tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["student"] + [s.name for s in columns] + ["total", "out_of", "notes"])
        for r in sorted(reports, key=lambda r: r.student):
            total, out_of, row = 0.0, 0.0, [r.student]
            for s in columns:
                o = r.outcomes[s.name]
                if o.score is None:
                    row.append(NEEDS_GPU)
                else:
                    row.append(_fmt_points(o.score))
                    total += o.score
                    out_of += s.points
            notes = "; ".join(r.incidents + [f"not submitted: {', '.join(r.missing)}"] * bool(r.missing))[:400]
            w.writerow(row + [_fmt_points(total), _fmt_points(out_of), notes])
    os.replace(tmp, out_dir / "grades.csv")
    for r in reports:
        path = out_dir / "feedback" / f"{r.student}.md"
        tmp = path.with_suffix(".md.tmp")
        tmp.write_text(feedback_markdown(r, columns, device), encoding="utf-8")
        os.replace(tmp, path)


def feedback_markdown(r: StudentReport, columns: list[FnSpec], device: str) -> str:
    graded = [s for s in columns if r.outcomes[s.name].score is not None]
    total = sum(r.outcomes[s.name].score for s in graded)
    out_of = sum(s.points for s in graded)
    lines = [f"# Feedback for {r.student}", "",
             f"Score: **{_fmt_points(total)} / {_fmt_points(out_of)}** (graded on {device}, on inputs the checks "
             f"in your notebooks do not show: other sizes, dtypes and seeds).", ""]
    skipped = [s for s in columns if r.outcomes[s.name].score is None]
    if skipped:
        lines += [f"Not graded here ({NEEDS_GPU}): " + ", ".join(f"`{s.name}`" for s in skipped)
                  + ". They need a CUDA GPU and nvcc; they do not count against you.", ""]
    if r.missing:
        lines += ["Not submitted (their functions score 0): " + ", ".join(f"`{n}.ipynb`" for n in r.missing), ""]
    lines += ["| notebook | function | score | status |", "|---|---|---|---|"]
    for s in columns:
        o = r.outcomes[s.name]
        score = NEEDS_GPU if o.score is None else f"{_fmt_points(o.score)} / {_fmt_points(s.points)}"
        lines.append(f"| {s.notebook} | `{s.name}` | {score} | {o.status} |")
    problems = [s for s in columns if r.outcomes[s.name].status not in ("ok", NEEDS_GPU, "not submitted")]
    if problems:
        lines += ["", "## What went wrong"]
        for s in problems:
            o = r.outcomes[s.name]
            lines += ["", f"### `{s.name}` ({s.notebook})"] + [f"- {m}" for m in o.messages or ["no result"]]
    if r.incidents or r.notes:
        lines += ["", "## Notes from running your notebooks"] + [f"- {n}" for n in (r.incidents + r.notes)[:40]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        child_main(argv[1])
        return 0
    if argv[:1] == ["--stage2"]:
        stage2_main(argv[1])
        return 0
    ap = argparse.ArgumentParser(prog="labkit grade", description=__doc__.split("\n\n")[0])
    ap.add_argument("submissions", type=Path, help="a folder with one folder or notebook per student")
    ap.add_argument("--out", type=Path, required=True, help="where grades.csv and feedback/ go")
    ap.add_argument("--workers", type=int, default=1, help="students graded at once (one GPU each on a multi-GPU host)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds allowed per notebook (default 300)")
    ap.add_argument("--exercise-timeout", type=float, default=None,
                    help="seconds allowed per code cell and per graded function (default: timeout / 4)")
    ap.add_argument("--memory-mb", type=int, default=8192, help="memory limit per student process (default 8192)")
    ap.add_argument("--graded", type=Path, default=COURSE_ROOT / "solutions" / "graded",
                    help="the instructor's graded tests (default: solutions/graded)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the hidden cases (default: graded/SEED)")
    ap.add_argument("--only", nargs="+", default=None, metavar="NOTEBOOK", help="grade only these notebooks")
    ap.add_argument("--device", choices=["auto", "cpu"], default="auto", help="cpu: grade without the GPU")
    args = ap.parse_args(argv)
    if not args.submissions.is_dir():
        ap.error(f"{args.submissions} is not a folder of submissions")
    if args.workers < 1 or args.timeout <= 0 or args.memory_mb < 256:
        ap.error("--workers must be >= 1, --timeout > 0, --memory-mb >= 256")

    import queue

    import torch

    specs = load_specs(args.graded)
    if args.only:
        unknown = [n for n in args.only if n not in specs]
        if unknown:
            ap.error(f"no graded tests for {unknown}; known: {sorted(specs)}")
        specs = {n: specs[n] for n in args.only}
    submissions = find_submissions(args.submissions)
    if not submissions:
        ap.error(f"no submissions (folders or .ipynb files) in {args.submissions}")
    if not args.only:  # grade the notebooks somebody submitted
        used = {n for _, paths in submissions for n in match_notebooks(paths, list(specs))[0]}
        specs = {n: v for n, v in specs.items() if n in used} or specs
    gpu = args.device == "auto" and torch.cuda.is_available()
    from labkit.check import have_cuda_toolchain

    seed = args.seed if args.seed is not None else default_seed(args.graded)
    for nb in specs.values():
        for s in nb:
            s.cases = make_cases(s, seed, gpu)
    args.out.mkdir(parents=True, exist_ok=True)
    slots = None
    if gpu:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [
            str(i) for i in range(torch.cuda.device_count())]
        slots = queue.Queue()
        if args.workers > len(ids):
            print(f"labkit grade: {args.workers} workers share {len(ids)} GPU(s); timed exercises are fairest with "
                  f"--workers {len(ids)} (one GPU each)")
        for k in range(args.workers):
            slots.put(ids[k % len(ids)])
    cpus = os.cpu_count() or 1
    workroot = Path(tempfile.mkdtemp(prefix="labkit-grade-"))
    forbidden = [str(p) for p in (args.graded, COURSE_ROOT / "solutions", COURSE_ROOT / "tests",
                                  COURSE_ROOT / ".git", args.out, args.submissions)]
    package = Path(__file__).resolve().parent
    for f in (args.out, args.submissions):
        if package.is_relative_to(f.resolve()):
            ap.error(f"{f} holds the labkit package itself, which the students' processes must read: "
                     f"put submissions and --out in folders of their own")
    ctx = Context(specs, args.timeout, args.exercise_timeout or max(5.0, args.timeout / 4), args.memory_mb, gpu,
                  gpu and have_cuda_toolchain(), forbidden, workroot, max(1, cpus // args.workers), slots)
    columns = [s for nb in specs.values() for s in nb]
    device = "a GPU" if gpu else "the CPU (no GPU)"
    print(f"labkit grade: {len(submissions)} submission(s), {len(columns)} function(s) from {len(specs)} notebook(s), "
          f"on {device}, {args.workers} worker(s)")
    reports: list[StudentReport] = []
    lock = threading.Lock()

    def one(item):
        i, (student, paths) = item
        try:
            r = grade_student(ctx, i, student, paths)
        except Exception as exc:  # a grader bug: this student gets a note, the batch goes on
            r = StudentReport(student, {s.name: Outcome(s.points, 0.0, "failed", [f"grader error: {exc!r}"])
                                        for s in columns}, [f"grader error: {exc!r}"])
        with lock:
            reports.append(r)
            graded = [s for s in columns if r.outcomes[s.name].score is not None]
            print(f"[{len(reports)}/{len(submissions)}] {student}: "
                  f"{_fmt_points(sum(r.outcomes[s.name].score for s in graded))} / "
                  f"{_fmt_points(sum(s.points for s in graded))} ({r.seconds:.1f} s)", flush=True)
        return r

    try:
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            list(pool.map(one, enumerate(submissions)))
        write_reports(args.out, reports, columns, "a GPU" if gpu else "the CPU")
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    print(f"wrote {args.out / 'grades.csv'} and {len(reports)} feedback file(s) in {args.out / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
