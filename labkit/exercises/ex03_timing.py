"""Exercise 03, timing: `median_ms(fn, device, warmup, reps)` on a function of known duration."""
from __future__ import annotations

import time

import torch

from labkit.exercises.inputs import here
from labkit.exercises.observe import snapshot
from labkit.exercises.spec import Function

NOTEBOOK = "03_timing"

# Bound on import (the grader imports this before any student code runs), so a submission that
# patches torch.cuda cannot change how the graded GPU workload is sized.
_SLEEP = getattr(torch.cuda, "_sleep", None)
_EVENT = torch.cuda.Event
_ELAPSED = torch.cuda.Event.elapsed_time
_RECORD = torch.cuda.Event.record
_SYNC = torch.cuda.synchronize
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


def call_median_ms(fn, args):
    """fn is timed on a callable whose first `warmup` calls are slow and one timed call is an outlier."""
    device = torch.device(args.get("device", "cpu"))
    ms, warmup, reps = float(args["ms"]), int(args["warmup"]), int(args["reps"])
    slow_calls = set(range(warmup)) | {warmup + int(args["outlier_at"])}
    calls = [0]
    if device.type == "cuda":
        per_ms = calibrate_gpu_sleep(ms)
        sleep = _SLEEP

        def work():
            sleep(int(per_ms * ms * (10 if calls[0] in slow_calls else 1)))
            calls[0] += 1
    else:
        def work():
            time.sleep(ms * (10 if calls[0] in slow_calls else 1) / 1e3)
            calls[0] += 1
    out = fn(work, device, warmup=warmup, reps=reps)
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        out = out.item()
    return {"median (ms)": snapshot(out), "calls of fn": calls[0]}


def median_ms_case(about: str, device: str, ms: float, warmup: int, reps: int, outlier_at: int) -> dict:
    """A function of `ms` on `device`, 10x slower on its warm-up calls and on timed call `outlier_at`."""
    return {"about": about,
            "args": {"device": device, "ms": ms, "warmup": warmup, "reps": reps, "outlier_at": outlier_at},
            "expected": {"median (ms)": ms, "calls of fn": warmup + reps}, "rtol": 0.3, "atol": 0.5}


def visible_median_ms() -> list[dict]:
    dev = str(here())
    return [median_ms_case(f"a {dev} function taking about 3 ms (10x slower on its first 2 calls, and once later)",
                           dev, 3.0, 2, 5, 3)]


FUNCTIONS = [Function("median_ms", call_median_ms, visible_median_ms, prepare=prepare)]
