"""The open-loop load generator's statistics, against a synthetic server with a known service time."""
import asyncio
import json
from collections import Counter

import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from fake_clock import AsyncioOnClock, FakeClock
from labkit.serving import loadgen
from labkit.serving.batchsim import poisson_arrivals
from serving_util import serving

SERVICE_S = 0.03


def synthetic_app(reject_every: int = 0, hold_until: int = 0):
    """Answers each request after SERVICE_S (requests overlap: no queue); every k-th gets a 503.

    hold_until: answer nothing before that many requests have arrived (a client that waits for answers
    before it sends more would never get one)."""
    seen = Counter()
    all_in = asyncio.Event()

    async def predict(request):
        seen["n"] += 1
        if seen["n"] >= hold_until:
            all_in.set()
        await request.body()
        if reject_every and seen["n"] % reject_every == 0:
            return JSONResponse({"error": "full"}, status_code=503)
        await all_in.wait()
        await asyncio.sleep(SERVICE_S)
        return JSONResponse({"y": [1.0]})

    async def metrics(request):
        return JSONResponse({"batch_sizes": {"1": seen["n"]}})

    return Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route("/metrics", metrics)])


def payload(i):
    return json.dumps({"x": [i]}).encode()


def test_statistics_of_a_known_result():
    r = loadgen.LoadResult(rate=10, sent=5, duration_s=2.0, latencies_ms=np.array([10.0, 20, 30, 40]),
                           rejected=1, batch_sizes=Counter({1: 2, 2: 1}))
    assert r.ok == 4 and r.throughput == 2.0 and r.pct(50) == 25.0 and r.mean_ms == 25.0
    assert r.goodput(20) == 1.0 and r.goodput(1000) == r.throughput and r.goodput(5) == 0.0
    assert r.mean_batch == pytest.approx(4 / 3)
    s = r.summary(slo_ms=20)
    assert s["goodput"] == 1.0 and s["p99_ms"] > s["p90_ms"] > s["p50_ms"]


def test_window_rates_split_the_throughput_into_samples():
    r = loadgen.LoadResult(rate=10, sent=5, duration_s=2.0, latencies_ms=np.array([10.0, 20, 30, 40]),
                           done_s=np.array([0.1, 0.2, 1.5, 2.0]))
    assert r.window_rates(2).tolist() == [2.0, 2.0] and r.window_rates(4).tolist() == [4.0, 0.0, 0.0, 4.0]
    assert r.window_rates(4).mean() == r.throughput
    with pytest.raises(ValueError):
        r.window_rates(0)


def test_poisson_arrivals_have_the_asked_rate():
    gaps = np.diff(poisson_arrivals(200.0, 20_000, seed=3))
    assert gaps.mean() == pytest.approx(1 / 200, rel=0.03) and gaps.std() == pytest.approx(1 / 200, rel=0.05)
    assert (gaps >= 0).all()


def test_open_loop_against_a_synthetic_server():
    # open loop: all 40 requests are sent on their Poisson schedule although none is answered before the last arrives
    with serving(synthetic_app(hold_until=40)) as url:
        r = loadgen.run(url, rate=60.0, n=40, payload=payload, max_s=5.0, timeout_s=30.0)
    assert r.sent == 40 and r.ok == 40 and r.rejected == r.errors == r.timeouts == 0
    assert r.pct(50) >= SERVICE_S * 1e3 and r.pct(99) >= r.pct(50)
    assert r.goodput(slo_ms=1.0) == 0.0 and r.goodput(slo_ms=1e6) == pytest.approx(r.throughput)
    # never sent early: the run lasts at least until the last scheduled send's answer (how much longer is the machine's)
    schedule = poisson_arrivals(60.0, 40, seed=0)
    assert r.duration_s >= schedule[-1] + SERVICE_S - 1e-6 and r.throughput == pytest.approx(40 / r.duration_s)
    assert r.batch_sizes == Counter({1: 40})
    assert r.send_lag_ms.shape == (40,) and (r.send_lag_ms >= 0).all()
    assert r.client_lag_ms == pytest.approx(np.percentile(r.send_lag_ms, 99))
    assert r.done_s.shape == (40,) and (r.done_s > 0).all() and (r.done_s <= r.duration_s).all()
    assert r.window_rates(5).mean() == pytest.approx(r.throughput)


def test_rejections_and_the_time_bound_are_counted(monkeypatch):
    # the sender's clock moves only as its schedule says: exactly the requests scheduled within max_s are sent
    clock = FakeClock()
    monkeypatch.setattr(loadgen, "time", clock)
    monkeypatch.setattr(loadgen, "asyncio", AsyncioOnClock(clock))
    with serving(synthetic_app(reject_every=4)) as url:
        r = loadgen.run(url, rate=50.0, n=10_000, payload=payload, max_s=0.6, timeout_s=30.0)
    scheduled = int((poisson_arrivals(50.0, 10_000, seed=0) <= 0.6).sum())
    assert 4 <= r.sent == scheduled < 10_000, "stops sending after max_s"
    assert r.rejected == r.sent // 4 and r.ok + r.rejected == r.sent and r.errors == r.timeouts == 0
    assert r.duration_s == pytest.approx(sum(clock.slept)) and r.duration_s <= 0.6


def test_client_timeouts_are_counted_not_raised():
    with serving(synthetic_app()) as url:
        r = loadgen.run(url, rate=50.0, n=5, payload=payload, timeout_s=SERVICE_S / 10, metrics=False)
    assert r.timeouts == 5 and r.ok == 0 and np.isnan(r.pct(50))


def test_only_loopback_targets_are_allowed():
    with pytest.raises(ValueError, match="127.0.0.1"):
        loadgen.run("http://example.com:80", rate=1.0, n=1, payload=payload)
    with pytest.raises(ValueError, match="rate"):
        loadgen.run("http://127.0.0.1:1", rate=0.0, n=1, payload=payload)


def test_a_server_that_closes_each_connection_is_still_answered():
    async def predict(request):
        await request.body()
        return JSONResponse({"y": [1.0]}, headers={"connection": "close"})

    app = Starlette(routes=[Route("/predict", predict, methods=["POST"])])
    with serving(app) as url:
        r = loadgen.run(url, rate=200.0, n=30, payload=payload, metrics=False)
    assert r.ok == r.sent == 30 and r.errors == 0


def test_garbage_collection_is_paused_during_a_run_and_restored_after():
    import gc

    seen = []

    async def predict(request):
        seen.append(gc.isenabled())  # the server runs in this process too: it sees the pause
        await request.body()
        return JSONResponse({"y": [1.0]})

    async def metrics(request):
        return JSONResponse({"batch_sizes": {}})

    app = Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route("/metrics", metrics)])
    assert gc.isenabled()
    with serving(app) as url:
        r = loadgen.run(url, rate=200.0, n=10, payload=payload, max_s=5.0)
    assert r.ok == 10 and seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:  # a caller that had it off keeps it off
        with serving(app) as url:
            loadgen.run(url, rate=200.0, n=5, payload=payload, max_s=5.0)
        assert not gc.isenabled()
    finally:
        gc.enable()
