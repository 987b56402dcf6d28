"""Exercise 03, timing: `median_ms(fn, device, warmup, reps)` on a function of known duration.

Graded, the workload is served from the grader's process (SERVED, labkit.grading.rounds): each call of the student's
`work()` asks the grader, which sleeps on a CPU (and times the sleep on its own clock) or says how long this call's
GPU sleep lasts, so the durations are in no closure, frame or case of the student's process before their calls.
On a GPU the sleep must run in the student's process: a call's answer there holds its duration.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from labkit import compat
from labkit.exercises.inputs import here
from labkit.exercises.observe import compare, snapshot
from labkit.exercises.spec import Function, Served

NOTEBOOK = "03_timing"

# Bound on import (the grader imports this before any student code runs), so a submission that
# patches torch.cuda cannot change how the graded GPU workload is sized.
_SLEEP = compat.gpu_sleep()
_EVENT = torch.cuda.Event
_ELAPSED = torch.cuda.Event.elapsed_time
_RECORD = torch.cuda.Event.record
_SYNC = torch.cuda.synchronize
_PERF, _NAP = time.perf_counter, time.sleep  # the CPU workload's sleep and the grader's clock for it
ATTEMPTS = 3  # measurements of a case while the grader's own one is implausible (a loaded machine)
_gpu_cycles_per_ms: float | None = None


def _time_sleep_ms(cycles: int) -> float:
    start, end = _EVENT(enable_timing=True), _EVENT(enable_timing=True)
    _RECORD(start)
    _SLEEP(cycles)
    _RECORD(end)
    _SYNC()
    return _ELAPSED(start, end)


def calibrate_gpu_sleep(target_ms: float = 3.0) -> float:
    """GPU clock cycles per millisecond of `torch.cuda._sleep`, measured now with CUDA events.

    The GPU's clock moves with its load, so this is measured again right before each timed case
    (sleeps of about `target_ms`, after a warm-up sleep), not once per process.
    """
    global _gpu_cycles_per_ms
    if _gpu_cycles_per_ms is None:
        _SLEEP(1000)
        _gpu_cycles_per_ms = 5_000_000 / max(_time_sleep_ms(5_000_000), 1e-3)
    cycles = max(1000, int(_gpu_cycles_per_ms * target_ms))
    _time_sleep_ms(cycles)  # warm-up at the load the case will run under
    per_ms = sorted(cycles / max(_time_sleep_ms(cycles), 1e-3) for _ in range(3))[1]
    _gpu_cycles_per_ms = per_ms
    return per_ms


def prepare(device: str) -> None:
    """In the grading child: a first calibration before student code runs."""
    if device == "cuda":
        calibrate_gpu_sleep()


MEASURED = "the grader's own median of the timed calls (ms)"
# served (the grader's process sleeps): the median over the timed calls of the longest each could have lasted as the
# student's clock saw it, the trip through the pipes and a loaded machine's scheduling included: from the grader's
# answer to the call before (or the run's start) to the next call's ask (Workload.span)
SPAN = "the grader's median bound on a timed call, from the answer before it to the next ask (ms)"
SPAN_OVER_SLEEP = (1.25, 1.0)  # the span counts up to 1.25x the grader's sleep + 1 ms (no constant fits every band)


class Workload:
    """One run's calls of the timed function: each sleeps `ms`, 10x longer on the `warmup` calls and on timed call
    `outlier_at`; on a CPU each sleep is timed on the grader's clock as it runs (a loaded machine's run long)."""

    def __init__(self, device: str, ms: float, warmup: int, reps: int, outlier_at: int):
        self.device, self.ms, self.warmup, self.reps = device, float(ms), int(warmup), int(reps)
        self.slow = set(range(self.warmup)) | {self.warmup + int(outlier_at)}
        self.calls, self.took, self.asked, self.answered = 0, [], [], []  # answered: when each served call returned
        self.opened = _PERF()  # before the run's request is sent: before its first call

    def next_ms(self) -> float:
        ms = self.ms * (10 if self.calls in self.slow else 1)
        self.calls += 1
        return ms

    def sleep_here(self) -> None:
        t0 = _PERF()
        _NAP(self.next_ms() / 1e3)
        self.took.append((_PERF() - t0) * 1e3)

    def measured(self) -> float | None:
        timed = self.took[self.warmup:self.warmup + self.reps]
        return statistics.median(timed) if len(timed) == self.reps else None

    def span(self) -> float | None:
        """Served on a CPU: the median over the timed calls of the longest each could have lasted on the caller's
        clock, from the grader's answer to the call before (or the run's start) to the next call's ask (inf for the
        last call, which has none). A timer around each call sees no more: however late the pipes or the scheduler
        carried an ask or an answer, an honest median is at most this one (ms)."""
        if self.device == "cuda" or len(self.answered) < self.warmup + self.reps:
            return None
        before, after = [self.opened, *self.answered], self.asked[1:]
        return statistics.median((after[k] - before[k]) * 1e3 if k < len(after) else math.inf
                                 for k in range(self.warmup, self.warmup + self.reps))

    def answer(self) -> dict:
        """The grader's side of one call when it serves the workload (labkit.grading.rounds): on a CPU the sleep
        runs here, in the grader's process; a GPU's sleep must run in the caller's, so it is told how long."""
        self.asked.append(_PERF())
        if self.device == "cuda":
            return {"ms": self.next_ms()}
        self.sleep_here()
        self.answered.append(_PERF())
        return {}

    def retry(self) -> bool:
        """The grader's own measurement is implausible, or its span of a call is over what SPAN_OVER_SLEEP counts
        (a machine too loaded to say, or a pipe too slow): measure the run again."""
        if self.device == "cuda":
            return False
        measured, span = self.measured(), self.span()
        return not _plausible(self.ms, measured) or (_number(span) and span > _span_cap(measured))  # (inf: no bound)


def _time_one(fn, device: torch.device, plan: dict) -> tuple:
    """(what fn returned, the run's Workload: its calls and the grader's measurement of the timed ones)."""
    load = Workload(**plan)
    if device.type == "cuda":
        per_ms, sleep = calibrate_gpu_sleep(load.ms), _SLEEP

        def work():
            sleep(int(per_ms * load.next_ms()))
    else:
        work = load.sleep_here
    return _returned(fn(work, device, warmup=load.warmup, reps=load.reps)), load


def _returned(out: Any) -> Any:
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        out = out.item()
    return snapshot(out)


def _plausible(nominal: float, measured: Any) -> bool:
    """The grader's measurement of the timed calls as a sleep of `nominal` ms allows (never early, not far over)."""
    ok = isinstance(measured, (int, float)) and not isinstance(measured, bool)
    return ok and nominal <= measured <= 1.5 * nominal + 2.0


def _measured_one(fn, device: torch.device, plan: dict) -> tuple:
    """_time_one, again while the grader's own measurement is implausible (the machine too loaded to say), up to
    ATTEMPTS times: the last attempt's result (the parent then grades against the grader's measurement of it)."""
    for _ in range(ATTEMPTS):
        got, load = _time_one(fn, device, plan)
        if not load.retry():
            break
    return got, load


def call_median_ms(fn, args):
    """fn times a callable whose first `warmup` calls are slow and one timed call is an outlier (in this process:
    the notebook's own check; the grader serves the workload from outside, SERVED).

    `args["ms"]` is one duration, or a list of very different ones (then fn runs once per duration,
    so no constant answer fits them all).
    """
    device = torch.device(args.get("device", "cpu"))
    runs = [_measured_one(fn, device, plan) for plan in _runs(args)]
    return _served_result(args, [got for got, _ in runs], [load for _, load in runs])


# -- graded: the workload served from the grader's process (labkit.grading.rounds), so the student's process never
# holds the durations (no closure, frame or case to read them from) nor the grader's measurement of them

def _runs(args: dict) -> list[dict]:
    many = isinstance(args["ms"], (list, tuple))
    return [{"device": args.get("device", "cpu"), "ms": float(ms), "warmup": int(args["warmup"]),
             "reps": int(args["reps"]), "outlier_at": int(args["outlier_at"])}
            for ms in (args["ms"] if many else [args["ms"]])]


def _for_child(plan: dict) -> dict:
    return {"device": plan["device"], "warmup": plan["warmup"], "reps": plan["reps"]}


def _run_served(fn, args: dict, ask) -> Any:
    """In the grading child: fn times a work() whose every call the grader serves (on a CPU it sleeps in the
    grader's process; on a GPU the grader says how long this process's GPU sleep lasts)."""
    device = torch.device(args["device"])
    if device.type == "cuda":
        per_ms, sleep = calibrate_gpu_sleep(), _SLEEP

        def work():
            sleep(int(per_ms * float(ask()["ms"])))
    else:
        def work():
            ask()
    return _returned(fn(work, device, warmup=int(args["warmup"]), reps=int(args["reps"])))


def _served_result(args: dict, medians: list, loads: list[Workload]) -> dict:
    if isinstance(args["ms"], (list, tuple)):
        return {"median (ms)": medians, "calls of fn": [w.calls for w in loads],
                MEASURED: [w.measured() for w in loads], SPAN: [w.span() for w in loads]}
    return {"median (ms)": medians[0], "calls of fn": loads[0].calls, MEASURED: loads[0].measured(),
            SPAN: loads[0].span()}


SERVED = Served(runs=_runs, for_child=_for_child, run=_run_served, server=lambda plan: Workload(**plan),
                result=_served_result, attempts=ATTEMPTS)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _expected_median(nominal: float, measured: Any, span: Any = None, got: Any = None) -> float:
    """What the grader saw of the same calls: a sleep never ends early, so a measurement under `nominal` is not the
    grader's (nominal counts); one far over it is a loaded machine, measured ATTEMPTS times (the grader's clock and
    sleep are bound before student code), so it is what the right answer saw. Served, the answer may lie anywhere
    from the grader's sleep to its bound on a call (SPAN; inf: none), at most SPAN_OVER_SLEEP over the sleep."""
    low = float(measured) if _number(measured) and measured >= nominal else nominal
    if not ((_number(span) or span == math.inf) and _number(got)):
        return low
    return min(max(float(got), low), max(low, min(float(span), _span_cap(low))))


def _span_cap(sleep_ms: float) -> float:
    """The most of a served call's span that counts, for a grader's sleep of `sleep_ms` (SPAN_OVER_SLEEP)."""
    scale, extra = SPAN_OVER_SLEEP
    return scale * sleep_ms + extra


def compare_median(expected: Any, got: Any, rtol: float = 0.0, atol: float = 0.0, **kwargs) -> list[str]:
    """compare(), against the grader's own measurement of the same calls where it is plausible (CPU sleeps)."""
    if isinstance(got, dict) and MEASURED in got and isinstance(expected, dict):
        measured, span = got[MEASURED], got.get(SPAN)
        got = {k: v for k, v in got.items() if k not in (MEASURED, SPAN)}
        nominal, answer = expected["median (ms)"], got.get("median (ms)")
        if isinstance(nominal, list):
            def listed(x):
                return x if isinstance(x, list) and len(x) == len(nominal) else [None] * len(nominal)
            median = [_expected_median(*v) for v in zip(nominal, listed(measured), listed(span), listed(answer))]
        else:
            median = _expected_median(nominal, measured, span, answer)
        expected = dict(expected, **{"median (ms)": median})
    return compare(expected, got, rtol, atol, **kwargs)


def median_ms_case(about: str, device: str, ms: float | list[float], warmup: int, reps: int, outlier_at: int) -> dict:
    """A function of `ms` (or of each duration in a list) on `device`, 10x slower on its warm-up calls
    and on timed call `outlier_at`."""
    many = isinstance(ms, (list, tuple))
    return {"about": about,
            "args": {"device": device, "ms": list(ms) if many else ms, "warmup": warmup, "reps": reps,
                     "outlier_at": outlier_at},
            "expected": {"median (ms)": [float(m) for m in ms] if many else ms,
                         "calls of fn": [warmup + reps] * len(ms) if many else warmup + reps},
            "rtol": 0.3, "atol": 0.5}


def visible_median_ms() -> list[dict]:
    dev = str(here())
    return [median_ms_case(f"a {dev} function taking about 3 ms (10x slower on its first 2 calls, and once later)",
                           dev, 3.0, 2, 5, 3)]


FUNCTIONS = [Function("median_ms", call_median_ms, visible_median_ms, compare=compare_median, prepare=prepare,
                      timed=True, rounds=SERVED)]
