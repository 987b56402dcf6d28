"""Dynamic batching: requests queue up; a batch launches when it is full or its oldest request waited long enough.

`launch_delay` is the whole policy (when to launch); `Batcher` is the asyncio machinery around it:
a bounded queue, padding to a few fixed batch sizes (so a model can replay CUDA graphs), results
scattered back to each caller, cancelled callers dropped before they are computed, and a drain
on shutdown. The model runs in one worker thread, so the event loop keeps taking requests meanwhile
(or inline, `threaded=False`, which saves the thread hand-off when the host has few free cores).

Used by: notebook 12, exercise 12.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch

Policy = Callable[[int, float, int, float], float]


def launch_delay(n_waiting: int, oldest_wait_s: float, max_batch: int, max_delay_s: float) -> float:
    """The batching policy: seconds to wait before launching a batch from the queue (0: launch now).

    Launch at once when `max_batch` requests wait, else when the oldest has waited `max_delay_s`.
    """
    if n_waiting <= 0:
        return math.inf
    if n_waiting >= max_batch:
        return 0.0
    return max(0.0, max_delay_s - oldest_wait_s)


def bucket_sizes(max_batch: int) -> tuple[int, ...]:
    """The batch sizes a model is compiled for: powers of two up to `max_batch`, and `max_batch`."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    sizes = {1 << k for k in range(max_batch.bit_length()) if 1 << k <= max_batch} | {max_batch}
    return tuple(sorted(sizes))


def bucket_for(n: int, sizes: tuple[int, ...]) -> int:
    """The smallest bucket that holds n requests."""
    for s in sizes:
        if s >= n:
            return s
    raise ValueError(f"a batch of {n} exceeds the largest bucket {sizes[-1]}")


def pad_to(x: torch.Tensor, size: int) -> torch.Tensor:
    """Stacked inputs padded with zero rows to `size` rows."""
    if x.shape[0] == size:
        return x
    return torch.cat([x, x.new_zeros((size - x.shape[0], *x.shape[1:]))])


def percentiles(values, qs=(50, 90, 99)) -> dict[str, float]:
    """{'p50': ..., 'p90': ..., 'p99': ...} of a sequence (nan when empty)."""
    import numpy as np

    arr = np.asarray(list(values), dtype=float)
    return {f"p{q:g}": (float(np.percentile(arr, q)) if arr.size else math.nan) for q in qs}


class QueueFull(RuntimeError):
    """The queue holds `max_queue` requests: the caller should retry later (HTTP 503)."""


class Closed(RuntimeError):
    """The batcher is shutting down and takes no new requests (HTTP 503)."""


@dataclass
class Stats:
    """What the batcher did: counts, the sizes of the batches it formed, recent latencies."""

    served: int = 0
    rejected: int = 0
    dropped: int = 0
    failed: int = 0
    batches: Counter = field(default_factory=Counter)  # real requests per batch -> count
    padded: Counter = field(default_factory=Counter)  # bucket size run -> count
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=20_000))
    busy_s: float = 0.0

    def snapshot(self) -> dict:
        return {"served": self.served, "rejected": self.rejected, "dropped": self.dropped, "failed": self.failed,
                "batch_sizes": {str(k): v for k, v in sorted(self.batches.items())},
                "bucket_sizes": {str(k): v for k, v in sorted(self.padded.items())},
                "latency_ms": {k: (None if math.isnan(v) else v) for k, v in percentiles(self.latencies_ms).items()},
                "model_busy_s": self.busy_s}


@dataclass
class _Request:
    x: torch.Tensor
    future: asyncio.Future
    arrived: float


class Batcher:
    """Batch single requests for `run_batch(stacked [bucket, ...]) -> [bucket, ...]` (call `start` in a loop)."""

    def __init__(self, run_batch: Callable[[torch.Tensor], torch.Tensor], max_batch: int = 32,
                 max_delay_s: float = 0.002, max_queue: int = 1024, buckets: tuple[int, ...] | None = None,
                 policy: Policy = launch_delay, threaded: bool = True):
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        if max_delay_s < 0:
            raise ValueError(f"max_delay_s must be >= 0 seconds, got {max_delay_s}")
        self.run_batch, self.policy = run_batch, policy
        self.buckets = tuple(buckets) if buckets else bucket_sizes(max_batch)
        self.max_queue, self.max_delay_s = max_queue, max_delay_s
        self.max_batch = max_batch
        self.stats = Stats()
        self._queue: deque[_Request] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        # torch's CPU thread count is per thread (OpenMP): the model thread takes this thread's, else it
        # starts one spinning OpenMP worker per core that starves the event loop between batches.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="batcher-model", initializer=torch.set_num_threads,
                                        initargs=(torch.get_num_threads(),)) if threaded else None

    @property
    def max_batch(self) -> int:
        return self._max_batch

    @max_batch.setter
    def max_batch(self, value: int) -> None:
        if not 1 <= value <= self.buckets[-1]:
            raise ValueError(f"max_batch must be in 1..{self.buckets[-1]} (the largest bucket), got {value}")
        self._max_batch = value

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def enqueue(self, x: torch.Tensor) -> asyncio.Future:
        """Queue one input (no batch dimension) without waiting; its future gets the output. QueueFull / Closed
        are raised at once when refused. For a caller that cannot await (an in-process load generator)."""
        return self._enqueue(x).future

    def _enqueue(self, x: torch.Tensor) -> _Request:
        if self._task is None:
            raise RuntimeError("Batcher.start() was not called: start it inside the event loop first")
        if self._closing:
            self.stats.rejected += 1
            raise Closed("the server is shutting down; retry on another replica")
        if len(self._queue) >= self.max_queue:
            self.stats.rejected += 1
            raise QueueFull(f"{len(self._queue)} requests already wait (max_queue={self.max_queue}); retry later")
        req = _Request(x, asyncio.get_running_loop().create_future(), time.perf_counter())
        self._queue.append(req)
        self._wake.set()
        return req

    def cancel(self, future: asyncio.Future) -> bool:
        """Drop the request of `future` if it still waits in the queue (True), as a caller that hung up."""
        for req in self._queue:
            if req.future is future:
                self._queue.remove(req)
                self.stats.dropped += 1
                future.cancel()
                return True
        return False

    async def submit(self, x: torch.Tensor) -> torch.Tensor:
        """Queue one input (no batch dimension) and wait for its output; QueueFull / Closed when refused."""
        req = self._enqueue(x)
        try:
            return await req.future
        except asyncio.CancelledError:  # the caller gave up: drop it if it is still waiting
            try:
                self._queue.remove(req)
                self.stats.dropped += 1
            except ValueError:
                pass  # already in a running batch: computed, the result discarded
            raise

    async def close(self, drain: bool = True) -> None:
        """Refuse new requests; finish the queued ones (drain) or fail them with Closed."""
        self._closing = True
        if not drain:
            while self._queue:
                req = self._queue.popleft()
                if not req.future.done():
                    req.future.set_exception(Closed("the server shut down before this request ran"))
        if self._task is not None:
            self._wake.set()
            await self._task
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    async def _loop(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            wait_s = 0.0 if self._closing else self.policy(
                len(self._queue), time.perf_counter() - self._queue[0].arrived, self.max_batch, self.max_delay_s)
            if wait_s > 0:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), wait_s)
                except TimeoutError:
                    pass
                continue
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            await self._run(batch)

    def _compute(self, xs: list[torch.Tensor]) -> torch.Tensor:
        n, size = len(xs), bucket_for(len(xs), self.buckets)
        out = self.run_batch(pad_to(torch.stack(xs), size))
        if out.shape[0] != size:
            raise RuntimeError(f"run_batch returned {out.shape[0]} rows for a batch of {size}: return one per input")
        self.stats.padded[size] += 1
        return out[:n]

    async def _run(self, batch: list[_Request]) -> None:
        self.stats.batches[len(batch)] += 1
        t0 = time.perf_counter()
        try:
            xs = [r.x for r in batch]
            if self._pool is None:  # inline: the event loop waits for the model (no thread hand-off)
                out = self._compute(xs)
            else:
                out = await asyncio.get_running_loop().run_in_executor(self._pool, self._compute, xs)
        except Exception as err:  # the model raised: every caller in the batch gets the error, the loop goes on
            self.stats.failed += len(batch)
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(err)
            return
        finally:
            self.stats.busy_s += time.perf_counter() - t0
        done = time.perf_counter()
        for r, y in zip(batch, out):
            if not r.future.done():
                r.future.set_result(y)
                self.stats.served += 1
                self.stats.latencies_ms.append((done - r.arrived) * 1e3)
