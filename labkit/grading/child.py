"""The grading child: `python -m labkit.grading.child IN OUT` runs one student's notebooks.

IN (the parent's, read here as data): job.json (the notebooks' code cells, the functions to grade,
limits); stdin: the run's key (labkit.grading.seal), then, each time the child asks (a `cases` event
once a notebook's cells have run), that notebook's case arguments (never the expected results): the
hidden inputs are never a file in the sandbox, nor in the child before the student's code ran.
OUT (the parent reads it): events.jsonl (progress, one JSON object per line; `fn_done` carries the
seal of the results) and <function>.pt (what each case returned, as plain data). Everything before
`install_guard` happens before student code.
"""
from __future__ import annotations

import builtins
import io
import json
import linecache
import os
import resource
import signal
import sys
import types
from pathlib import Path
from time import monotonic as _monotonic  # bound now: a student's rebinding of time.monotonic is not seen
from typing import Any, Callable

from labkit.exercises import integrity
from labkit.grading import answers, protocol, seal
from labkit.exercises.spec import Served
from labkit.grading.guard import install_guard


class ExerciseTimeout(BaseException):
    """Raised by SIGALRM when a cell or an exercise runs past its time limit."""


def _on_alarm(signum, frame):
    raise ExerciseTimeout()


def _set_alarm(seconds: float) -> None:
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.0))


def _stub_check_module() -> types.ModuleType:
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


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _describer(describe_error: Callable[[BaseException], str]) -> Callable[[BaseException, float], str]:
    def describe(exc: BaseException, timeout: float) -> str:
        if isinstance(exc, ExerciseTimeout):
            return f"timed out after {timeout:g} s"
        if isinstance(exc, SystemExit):
            return f"called sys.exit({exc.code!r})"
        if isinstance(exc, KeyboardInterrupt):
            return "raised KeyboardInterrupt"
        return describe_error(exc)
    return describe


def _grade_function(ns: dict, name: str, call: Callable, todo: list[dict], timeout: float, describe,
                    timed: bool = False, observed: bool = False) -> list[dict]:
    """Call the student's `name` on each case under one alarm; one result per case. A timed function's result
    counts only when nothing that judges it was changed, before or after its call, an `observed` one's (a `prepare`
    hook: e.g. the launch observer) only when the observer was not (labkit.exercises.integrity)."""
    fn, out = ns.get(name), []
    if not callable(fn):
        why = (f"{name} is not defined in the notebook (was it renamed, or did its cell fail?)"
               if fn is None else f"{name} is not a function (it is a {type(fn).__name__})")
        return [{"error": why} for _ in todo]
    try:
        _set_alarm(timeout)
        for case in todo:
            try:
                with answers.grading(name):  # labkit's own answer to `name` refuses to run now
                    if timed:
                        integrity.check(f"before {name} was graded")
                    elif observed:
                        integrity.check_observers(f"before {name} was graded")
                    obs = call(fn, case["args"])
                    if timed:
                        integrity.check(f"after {name} was graded")
                    elif observed:  # rebound during the call: the observer's verdict in `obs` is not its own
                        integrity.check_observers(f"after {name} was graded")
                    out.append({"obs": obs})
            except ExerciseTimeout:
                raise
            except BaseException as exc:
                out.append({"error": describe(exc, timeout)})
        _set_alarm(0)
    except ExerciseTimeout:
        _set_alarm(0)
        out += [{"timeout": True}] * (len(todo) - len(out))
    return out


def _serve_rounds(ns: dict, name: str, spec, timeout: float, describe, requests: Callable[[], bytes],
                  reply: Callable[[dict], None], ask: Callable[[], dict] | None = None) -> None:
    """Serve the parent's timed rounds of `name` (labkit.grading.rounds) under one alarm: each request runs the
    student's function once, and the reply is the round's observation, or why there is none. A served function's
    workload asks the parent for each of its calls (`ask`). The alarm counts the student's own time only: it runs
    while a request is handled and is paused between requests (the baseline's turns, the grader's waits)."""
    fn = ns.get(name)
    left = timeout

    def timed_handle(req: dict) -> dict:
        nonlocal left
        if left <= 0:
            raise ExerciseTimeout
        t0 = _monotonic()
        _set_alarm(left)
        try:
            return handle(req)
        finally:
            _set_alarm(0)
            left -= _monotonic() - t0

    try:
        _set_alarm(timeout)

        try:
            integrity.check(f"before {name} was graded")
            broken = None
        except ExerciseTimeout:
            raise
        except BaseException as exc:
            broken = describe(exc, timeout)
        _set_alarm(0)

        def handle(req: dict) -> dict:
            if broken is not None:
                return {"error": broken}
            if not callable(fn):
                return {"error": (f"{name} is not defined in the notebook (was it renamed, or did its cell fail?)"
                                  if fn is None else f"{name} is not a function (it is a {type(fn).__name__})")}
            try:
                if req["kind"] == "check":  # untimed, after each round
                    integrity.check(f"after a round of {name}")
                    return {"checked": True}
                with answers.grading(name):
                    if req["kind"] == "after":  # untimed, once the rounds are over
                        return {"obs": spec.after(fn, req["args"])}
                    if isinstance(spec, Served):
                        return {"obs": spec.run(fn, req["args"], ask)}
                    return {"obs": spec.run(fn, req["args"])}
            except ExerciseTimeout:
                raise
            except BaseException as exc:
                return {"error": describe(exc, timeout)}

        protocol.serve(lambda: json.loads(requests()), timed_handle, reply)
        _set_alarm(0)
    except ExerciseTimeout:
        _set_alarm(0)
        reply({"round": -1, "timeout": True})


def main(in_dir: str, out_dir: str) -> None:
    key, pipe = seal.read_key(keep=True)
    read, write = os.read, os.write  # bound before student code runs
    job = json.loads((Path(in_dir) / "job.json").read_text())
    reply_fd = job.get("reply_fd")  # the pipe of the parent's timed rounds (labkit.grading.rounds)
    if job.get("cpus"):  # this worker's own cores, before torch starts its threads
        os.sched_setaffinity(0, job["cpus"])
    out = Path(out_dir)
    events_fd = os.open(out / "events.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def emit(**ev) -> None:
        os.write(events_fd, (json.dumps(ev) + "\n").encode())

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["memory_mb"] * 2**20,) * 2)  # output and files it writes

    import torch

    import labkit
    from labkit import exercises
    from labkit.exercises.feedback import describe_error

    labkit.setup(device=job["device"], quick=True)
    torch.set_num_threads(max(1, int(job.get("threads", 1))))
    try:
        import triton  # noqa: F401  (before the guard: importing it may look for compilers)
        import triton.language  # noqa: F401
    except ImportError:
        pass
    load = torch.load
    fns = {name: exercises.function(name) for nb in job["notebooks"] for name in nb["functions"]}
    for prepare in dict.fromkeys(f.prepare for f in fns.values() if f.prepare is not None):
        prepare(job["device"])
    callers = {name: f.call for name, f in fns.items()}
    owned: dict[str, dict[str, str]] = {}
    for nb in job["notebooks"]:
        for name in nb["functions"]:
            for dotted in fns[name].answers:
                owned.setdefault(dotted, {})[name] = nb["name"]
    answers.install(owned)  # before student code: its imports get the stubs
    describe = _describer(describe_error)
    if job.get("rlimit_as"):  # address space beyond what torch and triton mapped on import (not with CUDA)
        extra = _vm_size() + job["memory_mb"] * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (extra, extra))
    save, replace = torch.save, os.replace
    stub = _stub_check_module()
    sys.modules["labkit.check"] = stub
    labkit.check = stub
    signal.signal(signal.SIGALRM, _on_alarm)
    install_guard(job["forbidden"], job["allowed"])
    if any(f.timed for f in fns.values()):
        integrity.capture()  # the judging code (the launch observer too) and process state, before student code
    elif any(f.prepare is not None for f in fns.values()):
        integrity.capture_observers()  # what observes an untimed call (the Triton launch observer)

    def ask() -> dict:
        """A served workload's call (labkit.exercises.spec.Served): a frame to the parent, its answer from stdin."""
        write(reply_fd, protocol.ASK_FRAME)
        return json.loads(seal.read_frame(pipe, read))

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
                emit(ev="cell_error", nb=nb["name"], cell=number, error=describe(exc, job["cell_timeout"]))
        emit(ev="cases", nb=nb["name"])  # the parent sends them now, once
        try:
            _set_alarm(job["cell_timeout"])
            cases = load(io.BytesIO(seal.read_frame(pipe, read)), weights_only=True)
            _set_alarm(0)
        except BaseException as exc:  # e.g. the student's code read the pipe first: its functions get no result
            _set_alarm(0)
            emit(ev="cell_error", nb=nb["name"], cell="(none)", error=f"the grader's cases did not arrive: {exc!r}")
            cases = {}
        for name in nb["functions"]:
            emit(ev="fn_start", nb=nb["name"], fn=name)
            todo = cases.get(name, [])
            limit = max(job["exercise_timeout"], fns[name].min_timeout_s)
            if fns[name].rounds is not None and reply_fd is not None:  # timed by the parent, from outside
                emit(ev="rounds", nb=nb["name"], fn=name)
                _serve_rounds(ns, name, fns[name].rounds, limit, describe, lambda: seal.read_frame(pipe, read),
                              lambda r: protocol.write_all(reply_fd, protocol.encode_reply(r, save), write), ask)
                emit(ev="fn_done", nb=nb["name"], fn=name)
                continue
            results = _grade_function(ns, name, callers[name], todo, limit, describe, fns[name].timed,
                                      fns[name].prepare is not None)
            try:
                mac = seal.write(key, out_dir, name, {"cases": results}, save, replace)
            except BaseException as exc:
                mac = seal.write(key, out_dir, name, {"cases": [
                    {"error": f"its output could not be saved: {describe(exc, 0)}"}] * len(todo)}, save, replace)
            emit(ev="fn_done", nb=nb["name"], fn=name, seal=mac)
        emit(ev="nb_done", nb=nb["name"])
    sys.stdout.flush()
    os._exit(0)  # skip anything the student registered to run at exit


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
