"""Open-loop load straight into a `Batcher` in this process: Poisson arrivals, no HTTP, no JSON.

What it measures is the batcher and the model, not a web stack: each arrival is queued with
`Batcher.enqueue` (a few microseconds of Python) at its scheduled time, and its latency runs from that
scheduled time to its answer, so a sender that falls behind still charges the wait to the request.

Used by: notebook 12.
"""
from __future__ import annotations

import asyncio
import gc
import math
import time
from collections import Counter
from typing import Callable

import numpy as np
import torch

from labkit.serving.batcher import Batcher, QueueFull, bucket_sizes
from labkit.serving.batchsim import poisson_arrivals
from labkit.serving.loadgen import LoadResult, in_thread


async def run_async(run_batch: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor, rate: float,
                    max_batch: int, max_delay_s: float, max_s: float = 2.0, timeout_s: float = 5.0, seed: int = 0,
                    max_queue: int = 1024, threaded: bool = True) -> LoadResult:
    """Offer a fresh `Batcher(run_batch, max_batch, max_delay_s)` Poisson arrivals at `rate`/s for `max_s` s.

    Request i carries row i % len(inputs) of `inputs` [k, d_in]. Its batch-size histogram is this run's alone.
    """
    if rate <= 0 or max_s <= 0 or timeout_s <= 0 or inputs.dim() != 2 or inputs.shape[0] < 1:
        raise ValueError(f"need rate > 0, max_s > 0, timeout_s > 0 and inputs [k >= 1, d_in]; got rate={rate}, "
                         f"max_s={max_s}, timeout_s={timeout_s}, inputs {tuple(inputs.shape)}")
    n = int(math.ceil(rate * max_s * 1.5)) + 10
    when = poisson_arrivals(rate, n, seed)
    when = when[when <= max_s]
    rows = list(inputs.unbind(0))
    batcher = Batcher(run_batch, max_batch=max_batch, max_delay_s=max_delay_s, max_queue=max_queue,
                      buckets=bucket_sizes(max_batch), threaded=threaded)
    batcher.start()
    done_at = np.full(len(when), np.nan)
    lag, futures, out, late = [], [], {"rejected": 0, "errors": 0}, set()

    def answered(i: int) -> Callable[[asyncio.Future], None]:
        def record(fut: asyncio.Future) -> None:
            if fut.cancelled() or i in late:  # an answer after the client hung up is not an answer
                return
            if fut.exception() is not None:
                out["errors"] += 1
            else:
                done_at[i] = time.perf_counter()
        return record

    gc_was_on = gc.isenabled()
    gc.collect()
    gc.disable()  # a full collection in the send loop would stall the schedule (see loadgen)
    try:
        t0, i = time.perf_counter(), 0
        while i < len(when):
            now = time.perf_counter() - t0
            while i < len(when) and when[i] <= now:  # every arrival now due, late ones included
                lag.append((now - when[i]) * 1e3)
                try:
                    fut = batcher.enqueue(rows[i % len(rows)])
                except QueueFull:
                    out["rejected"] += 1
                else:
                    fut.add_done_callback(answered(i))
                    futures.append((i, fut))
                i += 1
            if i < len(when):
                await asyncio.sleep(max(0.0, when[i] - (time.perf_counter() - t0)))
        sent_s = time.perf_counter() - t0
        pending = [f for _, f in futures if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        late.update(i for i, f in futures if not f.done())  # (a done future's callback may still be queued)
        for i, f in futures:
            if i in late:
                batcher.cancel(f)  # dropped if still queued; if in a running batch, its answer is ignored
        timeouts = len(late)
        await batcher.close(drain=True)  # requests already in a batch finish; nothing else waits
    finally:
        if gc_was_on:
            gc.enable()
    ok = ~np.isnan(done_at)
    done_s = done_at[ok] - t0
    duration = max(sent_s, float(done_s.max()) if done_s.size else 0.0)
    latencies = (done_s - when[ok]) * 1e3
    return LoadResult(rate, len(when), duration, latencies, out["rejected"], out["errors"], timeouts,
                      Counter(batcher.stats.batches), np.asarray(lag), done_s)


def run(*args, **kwargs) -> LoadResult:
    """`run_async` from plain code or a notebook (its own event loop, in a thread that keeps the caller's torch
    thread count: a new thread starts with OpenMP's default, one spinning worker per core, which starves the loop)."""
    return in_thread(lambda: run_async(*args, **kwargs), "inproc-load", torch.get_num_threads())
