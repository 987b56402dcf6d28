"""Exercise 03, timing: `median_ms(fn, device, warmup, reps)` on a function of known duration."""
from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from labkit import compat
from labkit.exercises.inputs import here
from labkit.exercises.observe import compare, snapshot
from labkit.exercises.spec import Function

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


def _time_one(fn, device: torch.device, ms: float, warmup: int, reps: int, outlier_at: int) -> tuple:
    """(what fn returned, how often it called the workload, the median the grader measured of the timed calls:
    on a loaded CPU, sleeps run long)."""
    slow_calls = set(range(warmup)) | {warmup + outlier_at}
    calls, took = [0], []
    if device.type == "cuda":
        per_ms = calibrate_gpu_sleep(ms)
        sleep = _SLEEP

        def work():
            sleep(int(per_ms * ms * (10 if calls[0] in slow_calls else 1)))
            calls[0] += 1
    else:
        clock, nap = _PERF, _NAP

        def work():
            t0 = clock()
            nap(ms * (10 if calls[0] in slow_calls else 1) / 1e3)
            took.append((clock() - t0) * 1e3)
            calls[0] += 1
    out = fn(work, device, warmup=warmup, reps=reps)
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        out = out.item()
    timed = took[warmup:warmup + reps]
    return snapshot(out), calls[0], statistics.median(timed) if len(timed) == reps else None


def _plausible(nominal: float, measured: Any) -> bool:
    """The grader's measurement of the timed calls as a sleep of `nominal` ms allows (never early, not far over)."""
    ok = isinstance(measured, (int, float)) and not isinstance(measured, bool)
    return ok and nominal <= measured <= 1.5 * nominal + 2.0


def _measured_one(fn, device: torch.device, ms: float, warmup: int, reps: int, outlier: int) -> tuple:
    """_time_one, again while the grader's own measurement is implausible (the machine too loaded to say), up to
    ATTEMPTS times: the last attempt's result (the parent then grades against the grader's measurement of it)."""
    for _ in range(ATTEMPTS):
        run = _time_one(fn, device, ms, warmup, reps, outlier)
        if device.type == "cuda" or _plausible(ms, run[2]):
            break
    return run


def call_median_ms(fn, args):
    """fn times a callable whose first `warmup` calls are slow and one timed call is an outlier.

    `args["ms"]` is one duration, or a list of very different ones (then fn runs once per duration,
    so no constant answer fits them all).
    """
    device = torch.device(args.get("device", "cpu"))
    warmup, reps, outlier = int(args["warmup"]), int(args["reps"]), int(args["outlier_at"])
    if isinstance(args["ms"], (list, tuple)):
        runs = [_measured_one(fn, device, float(ms), warmup, reps, outlier) for ms in args["ms"]]
        return {"median (ms)": [r[0] for r in runs], "calls of fn": [r[1] for r in runs],
                MEASURED: [r[2] for r in runs]}
    got, calls, measured = _measured_one(fn, device, float(args["ms"]), warmup, reps, outlier)
    return {"median (ms)": got, "calls of fn": calls, MEASURED: measured}


def _expected_median(nominal: float, measured: Any) -> float:
    """What the grader saw of the same calls: a sleep never ends early, so a measurement under `nominal` is not the
    grader's (nominal counts); one far over it is a loaded machine, measured ATTEMPTS times (the grader's clock and
    sleep are bound before student code), so it is what the right answer saw."""
    ok = isinstance(measured, (int, float)) and not isinstance(measured, bool) and math.isfinite(measured)
    return float(measured) if ok and measured >= nominal else nominal


def compare_median(expected: Any, got: Any, rtol: float = 0.0, atol: float = 0.0, **kwargs) -> list[str]:
    """compare(), against the grader's own measurement of the same calls where it is plausible (CPU sleeps)."""
    if isinstance(got, dict) and MEASURED in got and isinstance(expected, dict):
        got, measured = {k: v for k, v in got.items() if k != MEASURED}, got[MEASURED]
        nominal = expected["median (ms)"]
        if isinstance(nominal, list):
            measured = (measured if isinstance(measured, list) and len(measured) == len(nominal)
                        else [None] * len(nominal))
            median = [_expected_median(n, m) for n, m in zip(nominal, measured)]
        else:
            median = _expected_median(nominal, measured)
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
                      timed=True)]
