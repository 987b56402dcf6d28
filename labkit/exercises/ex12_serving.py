"""Exercise 12, serving: the batching policy `launch_delay(n_waiting, oldest_wait_s, max_batch, max_delay_s)`.

The student's policy drives `labkit.serving.batchsim.simulate` on an arrival trace (in the grading child);
the timeline it produces (each batch's size and launch time) is judged against the rules here:
every request answered exactly once, no batch over max_batch, no batch launched late (a full
queue, or an oldest request that waited max_delay, must launch as soon as the model is free)
nor early (before either happened: that wastes the chance to fill the batch).
"""
from __future__ import annotations

import math

import numpy as np

from labkit.serving import batchsim
from labkit.serving.batcher import bucket_for, bucket_sizes, launch_delay
from labkit.exercises.spec import Function

NOTEBOOK = "12_serving"

# Bound on import (before any student code runs in the grading child).
_SIMULATE, _CURVE, _ISFINITE = batchsim.simulate, batchsim.curve, math.isfinite
BATCH_TIME = {"sizes": [1, 64], "seconds": [0.5e-3, 3.7e-3]}  # t(b) = 0.45 ms + 0.05 ms per request


def _guarded(fn, n_requests: int):
    """`fn` with its answers checked (a real number) and a bound on how often it may say 'wait'."""
    limit, calls = 40 * n_requests + 1000, [0]

    def policy(n_waiting, oldest_wait_s, max_batch, max_delay_s):
        calls[0] += 1
        if calls[0] > limit:
            raise RuntimeError(f"asked {limit} times to serve {n_requests} request(s) and it keeps answering 'wait': "
                               f"does it return 0 when the batch is full or the oldest request waited max_delay?")
        out = fn(int(n_waiting), float(oldest_wait_s), int(max_batch), float(max_delay_s))
        if isinstance(out, bool) or not isinstance(out, (int, float, np.integer, np.floating)):
            raise TypeError(f"launch_delay returned {type(out).__name__}; return seconds to wait (0: launch now)")
        if math.isnan(out):
            raise ValueError("launch_delay returned nan; return seconds to wait (0: launch now)")
        return float(out)
    return policy


def call_launch_delay(fn, args):
    """Serve the case's arrival trace with `fn` as the policy; the timeline it made."""
    arrivals = np.asarray(args["arrivals_s"], float)
    t = _CURVE(args["batch_time"]["sizes"], args["batch_time"]["seconds"])
    res = _SIMULATE(arrivals, t, int(args["max_batch"]), float(args["max_delay_s"]),
                    policy=_guarded(fn, len(arrivals)))
    return {"batch_sizes": [int(k) for k in res.batch_sizes], "launches_s": [float(x) for x in res.launches]}


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if _ISFINITE(s) else "never"


def judge_timeline(expected: dict, got, rtol: float = 0.0, atol: float = 0.0) -> list[str]:
    """What breaks the rules in a timeline {"batch_sizes", "launches_s"} for the trace in `expected`."""
    if not isinstance(got, dict) or not {"batch_sizes", "launches_s"} <= set(got):
        return [f"expected a timeline (batch sizes and launch times), got {type(got).__name__}"]
    a, B, D = expected["arrivals_s"], expected["max_batch"], expected["max_delay_s"]
    t = _CURVE(expected["batch_time"]["sizes"], expected["batch_time"]["seconds"])
    buckets = bucket_sizes(B)
    sizes, launches = list(got["batch_sizes"]), list(got["launches_s"])
    n = len(a)
    if len(sizes) != len(launches) or sum(sizes) != n or any(k < 1 for k in sizes):
        return [f"{sum(sizes)} answers for {n} requests: every request must be answered exactly once"]
    if max(sizes) > B:
        return [f"a batch of {max(sizes)} requests: no batch may hold more than max_batch={B}"]
    late, early, head, free = [], [], 0, -math.inf
    for k, launch in zip(sizes, launches):
        full_at = a[head + B - 1] if head + B - 1 < n else math.inf
        due = max(free, a[head], min(a[head] + D, full_at))
        why = "the queue was full" if full_at <= a[head] + D else f"its oldest request had waited max_delay={_ms(D)}"
        if not _ISFINITE(launch):
            late.append(f"a batch never launched, though {why} at {_ms(due)}")
        elif not launch <= due + atol:
            late.append(f"a batch launched at {_ms(launch)}, {_ms(launch - due)} after {why} "
                        f"(at {_ms(due)}, the model free): its oldest request, arrived at {_ms(a[head])}, waited "
                        f"{_ms(launch - a[head])}")
        elif launch < due - atol:
            waiting = sum(1 for x in a[head:head + B] if x <= launch)
            early.append(f"a batch of {k} launched at {_ms(launch)}, when {waiting} of max_batch={B} waited and "
                         f"the oldest had waited {_ms(launch - a[head])} of max_delay={_ms(D)}: the rules wait "
                         f"until {_ms(due)} for more requests")
        free = launch + t(bucket_for(k, buckets)) if _ISFINITE(launch) else math.inf
        head += k
    out = []
    if late:
        out.append(f"{len(late)} of {len(sizes)} batches launched too late; first: {late[0]}")
    if early:
        out.append(f"{len(early)} of {len(sizes)} batches launched too early; first: {early[0]}")
    return out


def trace_case(about: str, arrivals_s, max_batch: int, max_delay_s: float) -> dict:
    """A case: serve `arrivals_s` (seconds, sorted) with max_batch and max_delay_s; the rules' timeline expected."""
    arrivals = [float(x) for x in np.sort(np.asarray(arrivals_s, float))]
    setup = {"arrivals_s": arrivals, "batch_time": BATCH_TIME, "max_batch": int(max_batch),
             "max_delay_s": float(max_delay_s)}
    ref = _SIMULATE(np.asarray(arrivals), _CURVE(BATCH_TIME["sizes"], BATCH_TIME["seconds"]), max_batch,
                    max_delay_s, policy=launch_delay)
    expected = setup | {"batch_sizes": [int(k) for k in ref.batch_sizes],
                        "launches_s": [float(x) for x in ref.launches]}
    return {"about": about, "args": setup, "expected": expected, "atol": 1e-6 + 1e-3 * max_delay_s}


def burst(start_s: float, n: int, over_s: float) -> list[float]:
    """n requests spread evenly over `over_s` seconds from `start_s`."""
    return [start_s + over_s * i / max(n - 1, 1) for i in range(n)]


def visible_launch_delay() -> list[dict]:
    # worked by hand with t(b) = 0.45 ms + 0.05 ms b: the lonely request launches at 2 ms (its delay);
    # the burst fills 8 by 0.7 ms, the next 8 wait for the model; 4 are left, launched at once or at their delay.
    return [trace_case("one lonely request, max_batch=8, max_delay=2 ms", [0.0], 8, 2e-3),
            trace_case("a burst of 20 requests within 2 ms, max_batch=8, max_delay=2 ms",
                       burst(0.0, 20, 2e-3), 8, 2e-3),
            trace_case("Poisson arrivals at 3000/s (200 requests), max_batch=16, max_delay=1 ms",
                       batchsim.poisson_arrivals(3000, 200, seed=0), 16, 1e-3),
            trace_case("Poisson arrivals at 1000/s (100 requests), max_delay=0",
                       batchsim.poisson_arrivals(1000, 100, 1),
                       8, 0.0)]


FUNCTIONS = [Function("launch_delay", call_launch_delay, visible_launch_delay, compare=judge_timeline,
                      answers=("labkit.serving.batcher.launch_delay",))]  # a stub while graded: labkit has the answer
