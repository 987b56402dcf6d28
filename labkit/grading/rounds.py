"""Speed graded in rounds the parent times from outside (labkit.exercises.spec.Rounds).

For a function with `rounds`, the grading child runs no timer and no baseline. It serves rounds: each request
(a frame on its stdin: the round's number and inputs) runs the student's code once, and the reply (a frame on a
pipe of its own: the round's observation as plain data) ends it. labkit's baseline serves the same requests in a
clean process of its own (labkit.grading.baseline), where no student code ever runs. The parent (Driver, in the
watchdog's process) pairs the two on the same inputs, the order alternating, and times each round from sending the
request to holding the whole reply: on a GPU by its own wall clock, on a CPU by the CPU time every process of that
side used meanwhile (read from outside, /proc and each process's CPU clock), which another process's load on the
same cores does not stretch. Between its rounds every process of the student's is stopped
(SIGSTOP): nothing of theirs runs while the baseline is timed, and work left running past a reply waits for, and
is timed in, their next round. A reply counts only when its observation is right (the function's `score` checks it
against the parent's own baseline run), so a reply sent early must already hold the round's result.

A served function (labkit.exercises.spec.Served) has no baseline: during its round the child asks the parent for
each call of its workload (a frame on the reply pipe), and the parent answers on the child's stdin, so the workload's
parameters and the parent's measurement of it never enter the student's process.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from labkit.exercises import speed
from labkit.exercises.spec import Served
from labkit.grading.protocol import read_reply
from labkit.grading.seal import frame
from labkit.grading.supervise import hold_cores
from labkit.proctree import cpu_seconds, signal_tree

BASELINE_START_S = 600.0  # the baseline process's start (importing torch, a CUDA context) and one round, at most
# Before each baseline round on a GPU: the GPU is idle when a one-element op finishes within IDLE_OP_S, IDLE_PROBES
# times in a row (kernels another process queued, the student's stopped one included, make it wait its turn); the
# student's process is stopped meanwhile, so work it left queued that keeps the GPU busy for IDLE_WAIT_S is its own.
IDLE_OP_S, IDLE_PROBES, IDLE_WAIT_S = 0.5e-3, 3, 5.0
# ...and before the first round: what an earlier process left queued drains first (a killed process's kernels run
# on; seen for seconds on an H100), so that what keeps the GPU busy later is the stopped student's.
START_IDLE_WAIT_S = 60.0
REPLY_GRACE_S = 5.0  # waited past the student's own time left for a reply (the child's alarm says it first)


class Stopped(Exception):
    """A round that did not give an observation: the function's result says why."""

    def __init__(self, result: dict):
        super().__init__(str(result))
        self.result = result


class StudentClock:
    """The student's own time left for a function's rounds (all its cases together): it runs only while the
    student's process serves a request, never during the baseline's turns or the grader's waits, so a loaded
    machine or a slow baseline costs the student no time (as the child's alarm counts: grading/child.py)."""

    def __init__(self, limit_s: float):
        self.left = limit_s

    def spend(self, seconds: float) -> None:
        self.left -= seconds


class Side:
    """One process that serves rounds: requests written to `requests`, replies read from `replies`."""

    def __init__(self, requests, replies: int):
        self.requests, self.replies = requests, replies

    def timed(self, req: dict, limit_s: float, on_ask: Callable[[], dict] | None = None,
              cpu: Callable[[], float] | None = None) -> tuple[float, dict]:
        """(seconds from sending `req` to holding its whole reply, the reply); replies to earlier requests (sent
        twice) are passed over. An ask meanwhile (a served workload's call, labkit.exercises.spec.Served) gets
        on_ask's answer, as a frame on the requests pipe. `cpu`: the side's CPU time (labkit.proctree.cpu_seconds),
        counted over that span instead of the wall clock."""
        data = frame(json.dumps(req).encode())
        clock = cpu or time.perf_counter
        t0 = clock()
        self.send(data)
        deadline = time.monotonic() + limit_s
        while True:
            reply = read_reply(self.replies, deadline)
            if reply.get("kind") == "ask" and not reply.get("timeout"):
                if on_ask is None:
                    raise ValueError("an ask where no workload is served")
                self.send(frame(json.dumps(on_ask()).encode()))
                continue
            if reply.get("timeout") or (reply["round"], reply.get("kind")) == (req["round"], req["kind"]):
                return clock() - t0, reply
            if reply["round"] > req["round"]:
                raise ValueError(f"a reply for round {reply['round']} to the request for round {req['round']}")

    def send(self, data: bytes) -> None:
        self.requests.write(data)
        self.requests.flush()

    def end(self) -> None:
        try:
            self.requests.write(frame(json.dumps({"end": True}).encode()))
            self.requests.flush()
        except (OSError, ValueError):
            pass


class Baseline:
    """labkit's baseline for one function, in a clean process of its own (python -m labkit.grading.baseline), on
    the student's cores and GPU: no student code ever runs in it."""

    def __init__(self, function: str, device: str, env: dict, cpus: list[int] | None, log: Path,
                 guard: tuple[list[str], list[str]] | None = None):
        r, w = os.pipe()
        job = json.dumps({"function": function, "device": device, "cpus": cpus, "reply_fd": w, "guard": guard})
        with open(log, "ab") as logf:
            self.proc = subprocess.Popen([sys.executable, "-m", "labkit.grading.baseline", job], env=env,
                                         stdin=subprocess.PIPE, stdout=logf, stderr=subprocess.STDOUT,
                                         pass_fds=(w,), start_new_session=True)
        os.close(w)
        self.side = Side(self.proc.stdin, r)
        self._r = r

    def close(self) -> None:
        self.side.end()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        os.close(self._r)


class Driver:
    """The paired rounds of every `rounds` function a grading child serves: started by its `rounds` event, run in a
    thread of the watchdog's process; `results[function]` holds one result per case ({"obs": ...} or why none);
    `failed` the functions whose results the grader's own failure decided (never stored: graded again next time)."""

    def __init__(self, specs: dict, device: str, env: dict, cpus: list[int] | None, limit_s: Callable[[str], float],
                 log: Path, guard: tuple[list[str], list[str]] | None = None, gpu_shared: bool = False):
        self.specs, self.device, self.env, self.cpus, self.limit_s, self.log = specs, device, env, cpus, limit_s, log
        self.gpu_shared = gpu_shared  # another worker's student may keep the GPU busy: then no one is blamed
        self.guard = guard  # the child's audit hook (forbidden, allowed), installed in the baseline's process too
        self.results: dict[str, list[dict]] = {}
        self.incidents: list[str] = []
        self.failed: set[str] = set()
        self._threads: list[threading.Thread] = []
        self.read_fd, self.write_fd = os.pipe()  # the child's replies; write_fd goes to it (pass_fds)

    def started(self) -> None:
        """Call once the child has started: the parent keeps no copy of the child's end (EOF when it is gone)."""
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None

    def on_event(self, ev: dict, proc: subprocess.Popen) -> None:
        fn = ev.get("fn")
        if ev.get("ev") == "rounds" and fn in self.specs and fn not in self.results:
            self.results[fn] = []
            t = threading.Thread(target=self._drive, args=(fn, proc), daemon=True)
            self._threads.append(t)
            t.start()

    def finish(self, timeout: float = 60.0) -> None:
        for t in self._threads:
            t.join(timeout)
        os.close(self.read_fd)
        if self.write_fd is not None:
            os.close(self.write_fd)

    def _drive(self, fn: str, proc: subprocess.Popen) -> None:
        spec, clock = self.specs[fn], StudentClock(self.limit_s(fn))
        rounds = spec.fn.rounds
        child = Side(proc.stdin, self.read_fd)
        signal_tree(proc.pid, signal.SIGSTOP)  # from here on the student's code runs only in its own rounds
        base = None
        try:
            if isinstance(rounds, Served):  # no baseline: the parent serves the workload itself
                for case in spec.cases:
                    self.results[fn].append(self._served(rounds, case["args"], child, proc, clock))
                return
            base = Baseline(fn, self.device, self.env, self.cpus, self.log, self.guard)
            blame = not self.gpu_shared
            if self.device == "cuda" and not _wait_for_idle_gpu(base.side, -1, blame=False, wait_s=START_IDLE_WAIT_S):
                blame = False  # busy before any round: not the student's doing that anyone can tell
                self.failed.add(fn)  # timings the grader cannot vouch for: measured again, never stored
                self.incidents.append(f"{fn}: the GPU was still busy {START_IDLE_WAIT_S:g} s after the student's "
                                      f"process was stopped, before its rounds: its timings may be off")
            for case in spec.cases:
                self.results[fn].append(self._case(rounds, case["args"], child, base, proc, clock, blame))
        except Exception as exc:  # the grader's own failure (its baseline process): said, and no points lost silently
            self.failed.add(fn)
            what = "workload could not be served" if isinstance(rounds, Served) else "baseline could not be timed"
            self.incidents.append(f"{fn}: the grader's {what} ({type(exc).__name__}: {exc})")
            self.results[fn] += [{"error": f"not graded: the grader's {what.split(' could')[0]} failed (see the "
                                           f"grader's incidents)"}] * (len(spec.cases) - len(self.results[fn]))
        finally:
            child.end()
            signal_tree(proc.pid, signal.SIGCONT)
            if base is not None:
                base.close()

    def _cpu_clock(self, proc: subprocess.Popen) -> Callable[[], float] | None:
        """On a CPU, the CPU time of `proc` and every process below it (None: the wall clock, as on a GPU, where the
        work is the device's). A round's own work, not the time other processes on its cores took from it: a
        loaded machine stretched the wall clock of some rounds and not their pair's, and moved the points."""
        return (lambda: cpu_seconds(proc.pid)) if self.device == "cpu" else None

    def _pinner(self, proc: subprocess.Popen) -> Callable[[], None]:
        """Set the student's processes back on the worker's cores (supervise.hold_cores), saying so once."""
        return lambda: hold_cores(proc.pid, self.cpus, self.incidents)

    def _served(self, served: Served, args: dict, child: Side, proc: subprocess.Popen, clock: StudentClock) -> dict:
        """One case of a served function: a round per run plan, each run's asks answered by a fresh server (again,
        up to `attempts` times, while the server's own measurement was off)."""
        n = 0
        observed, servers = [], []
        try:
            for plan in served.runs(args):
                for _ in range(max(1, served.attempts)):
                    server, n = served.server(plan), n + 1
                    req = {"round": n, "kind": "round", "args": served.for_child(plan)}
                    reply = _ask_student(proc, child, [req, {"round": n, "kind": "check"}], clock, server.answer,
                                         self._pinner(proc))[1]
                    if not server.retry():
                        break
                observed.append(reply["obs"])
                servers.append(server)
        except Stopped as stop:
            return stop.result
        return {"obs": served.result(args, observed, servers)}

    def _case(self, rounds, args: dict, child: Side, base: Baseline, proc: subprocess.Popen, clock: StudentClock,
              blame: bool) -> dict:
        thresholds, least, most = rounds.plan(args)
        obs: list = []
        mine_s: list[float] = []
        base_s: list[float] = []
        base_cpu, mine_cpu = self._cpu_clock(base.proc), self._cpu_clock(proc)  # None on a GPU: the wall clock

        def pair(i: int, base_first: bool) -> tuple[float, float]:
            req = {"round": i, "kind": "round", "args": rounds.for_round(args, i)}
            for who in ("base", "mine") if base_first else ("mine", "base"):
                if who == "base":
                    if self.device == "cuda":
                        _wait_for_idle_gpu(base.side, i, blame=blame)
                    seconds, reply = base.side.timed(req, BASELINE_START_S, cpu=base_cpu)
                    if "obs" not in reply:
                        raise RuntimeError(f"the baseline's round {i} failed: {str(reply.get('error'))[:300]}")
                    base_s.append(seconds)
                    continue
                # then, untimed, the child's own check that nothing judging it was changed
                seconds, reply = _ask_student(proc, child, [req, {"round": i, "kind": "check"}], clock,
                                              pin=self._pinner(proc), cpu=mine_cpu)
                obs.append(reply["obs"])
                mine_s.append(seconds)
            return base_s[-1], mine_s[-1]

        try:
            speed.paired_rounds(pair, thresholds, least, most)
            after = None
            if rounds.after is not None:  # untimed, in the student's process, once the rounds are over
                after = _ask_student(proc, child, [{"round": len(obs), "kind": "after", "args": args}], clock,
                                     pin=self._pinner(proc))[1]["obs"]
        except Stopped as stop:
            return stop.result
        result = rounds.result(args, obs, mine_s, base_s, after)
        if isinstance(result, dict):
            result["clock"] = "cpu" if self.device == "cpu" else "wall"  # what the seconds are (the feedback says)
        return {"obs": result}


def _wait_for_idle_gpu(base: Side, i: int, blame: bool = True, wait_s: float | None = None,
                       sleep: Callable[[float], None] = time.sleep) -> bool:
    """True once the baseline's process finds the GPU idle (IDLE_PROBES quick ops in a row). Still busy after
    `wait_s` (IDLE_WAIT_S): Stopped, blaming the student's work left running after its round i (`blame`: a GPU of
    the student's own, idle before its rounds), else False."""
    wait_s = IDLE_WAIT_S if wait_s is None else wait_s
    quick, t_end = 0, time.monotonic() + wait_s
    while True:
        took = base.timed({"round": i, "kind": "idle"}, BASELINE_START_S)[1].get("obs")
        quick = quick + 1 if isinstance(took, float) and took < IDLE_OP_S else 0
        if quick >= IDLE_PROBES:
            return True
        if time.monotonic() > t_end:
            if not blame:
                return False
            raise Stopped({"error": f"the GPU was still busy {wait_s:g} s after round {i} of yours had returned, "
                                    f"with your process stopped: work your code queued that runs after it returns (a "
                                    f"side stream, a thread) is not allowed; finish it before returning"})
        if quick == 0:
            sleep(0.01)


def _ask_student(proc: subprocess.Popen, child: Side, requests: list[dict], clock: StudentClock,
                 on_ask: Callable[[], dict] | None = None, pin: Callable[[], None] | None = None,
                 cpu: Callable[[], float] | None = None) -> tuple[float, dict]:
    """The student's processes started (`pin`ned first: back on their cores, however their last round widened
    them), `requests` answered in turn (each must succeed; asks meanwhile get on_ask's answer), stopped again; (the
    first request's seconds, on `cpu` where given, its reply). Stopped, with the function's result, when a reply is
    not an observation; the time the process ran is spent from `clock`, and a reply later than its time left (and a
    grace) times out."""
    if pin is not None:  # the watchdog's tick re-pins too, but a widening just before this round would reach it
        pin()
    started = time.monotonic()
    signal_tree(proc.pid, signal.SIGCONT)
    try:
        answered = []
        for req in requests:  # the next only after an observation
            left = max(started + clock.left + REPLY_GRACE_S - time.monotonic(), 0.0)
            answered.append(child.timed(req, left, on_ask, cpu if not answered else None))  # `cpu`: the first's
            if "obs" not in answered[-1][1]:
                break
    except TimeoutError:
        raise Stopped({"timeout": True}) from None
    except EOFError:
        raise Stopped({"error": f"the grading process ended during round {requests[0]['round']}"}) from None
    except ValueError as exc:
        raise Stopped({"error": f"round {requests[0]['round']}: its process sent {exc}: only the grader replies "
                                f"there"}) from None
    finally:
        signal_tree(proc.pid, signal.SIGSTOP)
        clock.spend(time.monotonic() - started)
    for _, reply in answered:
        if reply.get("timeout"):
            raise Stopped({"timeout": True})
        if "obs" not in reply and not reply.get("checked"):
            raise Stopped({"error": str(reply.get("error") or "no result")[:400]})
    return answered[0]
