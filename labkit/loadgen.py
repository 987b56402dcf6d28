"""An open-loop load generator: Poisson arrivals at a set rate over HTTP, each request's latency recorded.

Open loop means a request is sent at its arrival time whether or not earlier ones were answered,
as independent users do; a closed loop (send, wait, send) would slow down with the server and hide
its queue. Bounded in count and time, and only to 127.0.0.1 / localhost.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlparse

import numpy as np

from labkit.batchsim import poisson_arrivals

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
               "timeouts": self.timeouts, "client_lag_ms": self.client_lag_ms, "throughput": self.throughput, "p50_ms": self.pct(50),
               "p90_ms": self.pct(90), "p99_ms": self.pct(99), "mean_ms": self.mean_ms, "mean_batch": self.mean_batch}
        if slo_ms is not None:
            out["goodput"] = self.goodput(slo_ms)
        return out


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname
    if host not in LOOPBACK:
        raise ValueError(f"the load generator only targets this machine (127.0.0.1 / localhost), not {host!r}")


async def _one(client, url: str, body: bytes, timeout_s: float, out: dict) -> None:
    t0 = time.perf_counter()
    try:
        r = await client.post(url, content=body, headers={"content-type": "application/json"}, timeout=timeout_s)
    except Exception as err:  # httpx.TimeoutException and friends: the client gave up
        import httpx

        out["timeouts" if isinstance(err, httpx.TimeoutException) else "errors"] += 1
        return
    ms = (time.perf_counter() - t0) * 1e3
    if r.status_code == 200:
        out["lat"].append(ms)
    elif r.status_code == 503:
        out["rejected"] += 1
    else:
        out["errors"] += 1


async def run_async(url: str, rate: float, n: int, payload: Callable[[int], bytes], max_s: float = 10.0,
                    timeout_s: float = 5.0, seed: int = 0, metrics: bool = True) -> LoadResult:
    """Send up to n requests to `url`/predict at Poisson times of mean `rate` per second, for at most `max_s` s."""
    import httpx

    check_loopback(url)
    if n < 1 or rate <= 0 or max_s <= 0:
        raise ValueError(f"need n >= 1, rate > 0 and max_s > 0; got n={n}, rate={rate}, max_s={max_s}")
    base = url.rstrip("/")
    when = poisson_arrivals(rate, n, seed)
    bodies = [payload(i) for i in range(n)]
    out = {"lat": [], "rejected": 0, "errors": 0, "timeouts": 0}
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=4096)
    async with httpx.AsyncClient(limits=limits, trust_env=False) as client:
        before = (await client.get(base + "/metrics")).json()["batch_sizes"] if metrics else {}
        tasks, lag, t0 = [], [], time.perf_counter()
        for i, t in enumerate(when):
            if t > max_s:
                break
            delay = t - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            lag.append(max(0.0, (time.perf_counter() - t0 - t) * 1e3))
            tasks.append(asyncio.ensure_future(_one(client, base + "/predict", bodies[i], timeout_s, out)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        after = (await client.get(base + "/metrics")).json()["batch_sizes"] if metrics else {}
    formed = Counter({int(k): v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0})
    return LoadResult(rate, len(tasks), duration, np.asarray(out["lat"]), out["rejected"], out["errors"],
                      out["timeouts"], formed, np.asarray(lag))


def run(url: str, rate: float, n: int, payload: Callable[[int], bytes], **kwargs) -> LoadResult:
    """`run_async` from plain code or a notebook (its own event loop, in a thread)."""
    result: list = []

    def target():
        try:
            result.append(asyncio.run(run_async(url, rate, n, payload, **kwargs)))
        except BaseException as err:  # re-raised in the caller's thread
            result.append(err)

    th = threading.Thread(target=target, name="loadgen")
    th.start()
    th.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]
