"""An open-loop load generator: Poisson arrivals at a set rate over HTTP, each request's latency recorded.

Open loop means a request is sent at its arrival time whether or not earlier ones were answered,
as independent users do; a closed loop (send, wait, send) would slow down with the server and hide
its queue. Bounded in count and time, and only to 127.0.0.1 / localhost.

Used by: notebook 12.
"""
from __future__ import annotations

import asyncio
import gc
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlparse

import numpy as np

from labkit.serving.batchsim import poisson_arrivals
from labkit.serving.client import metrics as server_metrics

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class LoadResult:
    """One load run: each answered request's latency (ms) and what happened to the others."""

    rate: float
    sent: int
    duration_s: float
    latencies_ms: np.ndarray
    rejected: int = 0  # 503: queue full
    errors: int = 0  # other 4xx/5xx answers
    timeouts: int = 0  # the client gave up waiting
    batch_sizes: Counter = field(default_factory=Counter)  # as the server formed them (from /metrics)
    send_lag_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))  # how late each send left its schedule
    done_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # when each answer arrived, s since the start

    @property
    def client_lag_ms(self) -> float:
        """p99 of how late requests were sent: large means the client, not the server, was the limit."""
        return float(np.percentile(self.send_lag_ms, 99)) if self.send_lag_ms.size else 0.0

    @property
    def ok(self) -> int:
        return len(self.latencies_ms)

    @property
    def throughput(self) -> float:
        """Answered requests per second over the run."""
        return self.ok / self.duration_s if self.duration_s > 0 else math.nan

    def window_rates(self, windows: int = 5) -> np.ndarray:
        """Answered requests per second in each of `windows` equal slices of the run: the throughput's samples
        (their mean is `throughput`), from which a claim about it can tell a difference from noise."""
        if windows < 1:
            raise ValueError(f"need at least one window, got {windows}")
        if self.duration_s <= 0:
            return np.full(windows, math.nan)
        counts, _ = np.histogram(self.done_s, bins=windows, range=(0.0, self.duration_s))
        return counts / (self.duration_s / windows)

    def goodput(self, slo_ms: float) -> float:
        """Requests per second answered within the latency objective `slo_ms`."""
        return float((self.latencies_ms <= slo_ms).sum()) / self.duration_s if self.duration_s > 0 else math.nan

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.ok else math.nan

    @property
    def mean_ms(self) -> float:
        return float(self.latencies_ms.mean()) if self.ok else math.nan

    @property
    def mean_batch(self) -> float:
        n = sum(self.batch_sizes.values())
        return sum(k * v for k, v in self.batch_sizes.items()) / n if n else math.nan

    def summary(self, slo_ms: float | None = None) -> dict[str, float]:
        out = {"rate": self.rate, "sent": self.sent, "ok": self.ok, "rejected": self.rejected, "errors": self.errors,
               "timeouts": self.timeouts, "client_lag_ms": self.client_lag_ms, "throughput": self.throughput,
               "p50_ms": self.pct(50),
               "p90_ms": self.pct(90), "p99_ms": self.pct(99), "mean_ms": self.mean_ms, "mean_batch": self.mean_batch}
        if slo_ms is not None:
            out["goodput"] = self.goodput(slo_ms)
        return out


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname
    if host not in LOOPBACK:
        raise ValueError(f"the load generator only targets this machine (127.0.0.1 / localhost), not {host!r}")


class _Pool:
    """Keep-alive HTTP/1.1 connections to one host:port, opened on demand, at most `limit` at a time.

    A minimal client on asyncio streams (one POST, a Content-Length answer): a general client such as
    httpx spends about a millisecond of Python per request and manages its pool in time that grows
    with the number of open connections, so at a few hundred requests per second it, not the server,
    becomes the bottleneck. A load generator must be cheaper than the server it loads.
    """

    def __init__(self, host: str, port: int, limit: int):
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(limit)

    async def post(self, path: str, body: bytes) -> int:
        """POST `body` (JSON) to `path`; the answer's status code (the body is read and discarded)."""
        request = (b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                   b"\r\n%s" % (path.encode(), self.host.encode(), self.port, len(body), body))
        async with self.slots:
            while True:
                reused = bool(self.idle)
                reader, writer = self.idle.pop() if reused else await asyncio.open_connection(self.host, self.port)
                try:
                    writer.write(request)
                    head = await reader.readuntil(b"\r\n\r\n")
                    status, length, close = _parse_head(head)
                    await reader.readexactly(length)
                except (asyncio.IncompleteReadError, ConnectionError) as err:
                    writer.close()
                    if reused and not getattr(err, "partial", b""):
                        continue  # the server had closed this idle connection: send again on a fresh one
                    raise
                except BaseException:  # timed out, cancelled or broken: this connection is not reusable
                    writer.close()
                    raise
                if close:
                    writer.close()
                else:
                    self.idle.append((reader, writer))
                return status

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


def _parse_head(head: bytes) -> tuple[int, int, bool]:
    """(status, Content-Length, whether the server closes the connection) of a response head."""
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, close = None, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection":
            close = value.strip().lower() == b"close"
        elif name == b"transfer-encoding":
            raise ValueError("the server sent a chunked answer; the load generator reads Content-Length answers only")
    if length is None:
        raise ValueError(f"the server's answer (status {status}) has no Content-Length")
    return status, length, close


async def _one(pool: _Pool, body: bytes, timeout_s: float, out: dict) -> None:
    t0 = time.perf_counter()
    try:
        status = await asyncio.wait_for(pool.post("/predict", body), timeout_s)
    except TimeoutError:  # the client gave up (and hung up: the server drops it)
        out["timeouts"] += 1
        return
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        out["errors"] += 1
        return
    done = time.perf_counter()
    ms = (done - t0) * 1e3
    if status == 200:
        out["lat"].append(ms)
        out["done"].append(done)
    elif status == 503:
        out["rejected"] += 1
    else:
        out["errors"] += 1


def _batch_sizes(base: str) -> dict:
    return server_metrics(base)["batch_sizes"]


async def run_async(url: str, rate: float, n: int, payload: Callable[[int], bytes], max_s: float = 10.0,
                    timeout_s: float = 5.0, seed: int = 0, metrics: bool = True,
                    max_connections: int = 1024) -> LoadResult:
    """Send up to n requests to `url`/predict at Poisson times of mean `rate` per second, for at most `max_s` s.

    At most `max_connections` requests are in flight; more wait for a free connection (their wait counts
    in their latency, and in `send_lag_ms` when it delays the sender).
    """
    check_loopback(url)
    if n < 1 or rate <= 0 or max_s <= 0:
        raise ValueError(f"need n >= 1, rate > 0 and max_s > 0; got n={n}, rate={rate}, max_s={max_s}")
    parts = urlparse(url)
    base = url.rstrip("/")
    when = poisson_arrivals(rate, n, seed)
    bodies = [payload(i) for i in range(n)]
    out = {"lat": [], "done": [], "rejected": 0, "errors": 0, "timeouts": 0}
    loop = asyncio.get_running_loop()
    before = await loop.run_in_executor(None, _batch_sizes, base) if metrics else {}
    try:  # one file descriptor per connection: leave some for everything else this process has open
        import resource

        max_connections = min(max_connections, max(8, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 128))
    except ImportError:  # Windows has no such limit to ask
        pass
    pool = _Pool(parts.hostname, parts.port or 80, max_connections)
    # A full garbage collection walks every object of the process (a notebook kernel holds millions):
    # one in the send loop stalls the schedule by ~100 ms. The run is bounded, so collect now, pause after.
    gc_was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        tasks, lag, t0 = [], [], time.perf_counter()
        for i, t in enumerate(when):
            now = time.perf_counter() - t0
            if t > max_s or now > max_s:  # a client that falls behind stops on time too
                break
            if t > now:
                await asyncio.sleep(t - now)
                now = time.perf_counter() - t0
            lag.append(max(0.0, (now - t) * 1e3))
            tasks.append(loop.create_task(_one(pool, bodies[i], timeout_s, out)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    finally:
        pool.close()
        if gc_was_on:
            gc.enable()
    after = await loop.run_in_executor(None, _batch_sizes, base) if metrics else {}
    formed = Counter({int(k): v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0})
    return LoadResult(rate, len(tasks), duration, np.asarray(out["lat"]), out["rejected"], out["errors"],
                      out["timeouts"], formed, np.asarray(lag), np.asarray(out["done"], dtype=float) - t0)


def run(url: str, rate: float, n: int, payload: Callable[[int], bytes], **kwargs) -> LoadResult:
    """`run_async` from plain code or a notebook (its own event loop, in a thread)."""
    return in_thread(lambda: run_async(url, rate, n, payload, **kwargs), "loadgen")


def in_thread(coroutine: Callable[[], Any], name: str, threads: int | None = None) -> Any:
    """Run `coroutine()` to completion on its own event loop in a new thread (a notebook's loop is busy) and
    return its result or raise its error here; `threads` sets that thread's torch CPU threads."""
    result: list = []

    def target():
        if threads is not None:
            import torch  # only for a caller that asks: the load generator itself needs no torch

            torch.set_num_threads(threads)
        try:
            result.append(asyncio.run(coroutine()))
        except BaseException as err:  # re-raised in the caller's thread
            result.append(err)

    th = threading.Thread(target=target, name=name)
    th.start()
    th.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]
