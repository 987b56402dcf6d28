"""The batcher without the wall clock: an event simulation of one model fed by an arrival trace.

`simulate` runs the same policy as `labkit.serving.batcher.Batcher` (one batch in flight, padded to a
bucket, the model's time per batch taken from a measured curve), in milliseconds of simulated
time; `estimate_latency` is a back-of-the-envelope queueing model to check both against.

Used by: notebook 12, exercise 12.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from labkit.serving.batcher import Policy, bucket_for, bucket_sizes, launch_delay


def poisson_arrivals(rate_per_s: float, n: int, seed: int = 0) -> np.ndarray:
    """Arrival times in seconds of n requests at `rate_per_s` on average (exponential gaps)."""
    if not (0 < rate_per_s < math.inf) or n < 1:  # (a NaN rate fails this too)
        raise ValueError(f"need a positive, finite rate and at least one request, got rate={rate_per_s}, n={n}")
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate_per_s, n))


def curve(sizes, seconds) -> Callable[[int], float]:
    """Time per batch (s) at any size, interpolated linearly between measured (size, seconds) points."""
    xs, ys = np.asarray(sizes, float), np.asarray(seconds, float)
    order = np.argsort(xs)
    xs, ys = xs[order], ys[order]
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
    return lambda b: float(np.interp(b, xs, ys)) if b <= xs[-1] else float(ys[-1] + slope * (b - xs[-1]))


@dataclass
class SimResult:
    """Each request's latency (s), each batch's size and launch time (s)."""

    latencies: np.ndarray
    batch_sizes: np.ndarray
    launches: np.ndarray
    busy_s: float
    span_s: float

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.span_s if self.span_s > 0 else math.nan

    def pct_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies, q) * 1e3)

    @property
    def mean_ms(self) -> float:
        return float(self.latencies.mean() * 1e3)

    def histogram(self) -> Counter:
        return Counter(self.batch_sizes.tolist())


def simulate(arrivals: np.ndarray, batch_time: Callable[[int], float], max_batch: int, max_delay_s: float,
             policy: Policy = launch_delay, buckets: tuple[int, ...] | None = None) -> SimResult:
    """Serve `arrivals` (sorted seconds) with one model whose batch of b (padded to a bucket) takes batch_time(b).

    Event-driven: time jumps from event to event (an arrival, the model coming free, the policy's
    timer running out), so n requests cost O(n) steps, each asking the policy once.
    """
    arrivals = np.asarray(arrivals, float)
    if arrivals.ndim != 1 or not np.isfinite(arrivals).all() or (np.diff(arrivals) < 0).any():
        raise ValueError("arrivals must be a 1-D array of finite times in seconds, sorted (see poisson_arrivals)")
    buckets = tuple(buckets or bucket_sizes(max_batch))
    if max_batch > buckets[-1]:
        raise ValueError(f"max_batch={max_batch} exceeds the largest bucket {buckets[-1]}")
    run_s = {b: float(batch_time(b)) for b in buckets}  # the curve is asked once per bucket, not once per batch
    if not all(math.isfinite(t) and t >= 0 for t in run_s.values()):
        raise ValueError(f"batch_time must give finite, non-negative seconds; got {run_s}")
    n = len(arrivals)
    a = arrivals.tolist()  # Python floats: each step below is a few scalar operations
    done = np.empty(n)
    sizes, launches = [], []
    head, nxt, now, busy = 0, 0, 0.0, 0.0  # queue = a[head:nxt]; the model is free at `now`
    steps, max_steps = 0, 64 * n + 4096  # a launch_delay policy needs about 3 steps per request
    while head < n:
        steps += 1
        if steps > max_steps:  # a policy that never launches (or a bug) must not hang a notebook
            raise RuntimeError(f"simulate: no progress after {max_steps} steps ({head} of {n} requests served, "
                               f"now={now!r} s); check the policy returns 0 once max_delay_s has passed")
        if head == nxt and a[nxt] > now:  # nothing waits: jump to the next arrival
            now = a[nxt]
        while nxt < n and a[nxt] <= now:
            nxt += 1
        wait = policy(nxt - head, now - a[head], max_batch, max_delay_s)
        if wait > 0 and now + wait > now:  # wait for the timer or the next arrival, whichever is first
            now = min(now + wait, a[nxt]) if nxt < n else now + wait  # (a wait lost to rounding launches now)
            continue  # (a policy that waits forever launches at now = inf: "never")
        k = min(max_batch, nxt - head)
        t = run_s[bucket_for(k, buckets)]
        launches.append(now)
        sizes.append(k)
        now += t
        busy += t
        done[head:head + k] = now
        head += k
    span = float(done.max() - arrivals[0]) if n else 0.0
    return SimResult(done - arrivals, np.asarray(sizes), np.asarray(launches), busy, span)


def estimate_latency(rate_per_s: float, max_delay_s: float, batch_time: Callable[[int], float],
                     max_batch: int, buckets: tuple[int, ...] | None = None) -> tuple[float, float]:
    """(mean latency s, mean batch size) from a simple model; latency inf when the model cannot keep up.

    A batch gathers requests over a window W = max(delay, t(b)) (the delay after its first request,
    or the previous batch's run when that is longer): b = min(B, 1 + rate * W), with t(b) at b's bucket.
    The model is busy a fraction rho = rate * t(b) / b of the time: a request that finds it busy waits
    half a run, one that finds it idle waits the delay (the first of a batch all of it, the rest half).
    """
    buckets = buckets or bucket_sizes(max_batch)
    tb = lambda b: batch_time(bucket_for(min(max_batch, max(1, round(b))), buckets))  # noqa: E731
    b = 1.0
    for _ in range(200):  # fixed point of the batch size
        b = min(float(max_batch), 1.0 + rate_per_s * max(max_delay_s, tb(b)))
    t = tb(b)
    busy = rate_per_s * t / b
    if busy >= 1:
        return math.inf, b
    idle_wait = (max_delay_s + (b - 1) * max_delay_s / 2) / b
    return busy * t / 2 + (1 - busy) * idle_wait + t, b
