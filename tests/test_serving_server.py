"""The HTTP server: validation answers 4xx with a message, overload answers 503, gone clients are dropped."""
import asyncio
import json
import threading

import httpx
import pytest
import torch

from fake_clock import FakeClock
from labkit.serving import client, server
from serving_util import serving, uvicorn_serving, wait_until

D_IN = 5


class Model:
    """x[:, :2] * 3, counting its calls (`entered`, before the gate) and rows; it stalls while `gate` is clear."""

    def __init__(self):
        self.gate, self.rows, self.fail, self.entered = threading.Event(), 0, False, 0
        self.gate.set()

    def __call__(self, x):
        self.entered += 1
        self.gate.wait(60)  # (a bound only so that a broken test cannot hang the suite)
        self.rows += x.shape[0]
        if self.fail:
            raise RuntimeError("weights on fire")
        return x[:, :2] * 3


@pytest.fixture
def model():
    return Model()


def app_for(model, **kw):
    kw = {"max_batch": 4, "max_delay_s": 0.001, "max_queue": 64} | kw
    return server.make_app(model, D_IN, **kw)


def post(url, body):
    return httpx.post(url + "/predict", content=body, trust_env=False, timeout=10)


def test_predicts_and_reports_metrics(model):
    with serving(app_for(model)) as url:
        r = post(url, json.dumps({"x": [1, 2, 3, 4, 5.5]}))
        assert r.status_code == 200 and r.json() == {"y": [3.0, 6.0]}
        m = client.metrics(url)
    assert m["served"] == 1 and m["queue_depth"] == 0 and m["batch_sizes"] == {"1": 1}
    assert set(m["latency_ms"]) == {"p50", "p90", "p99"} and m["latency_ms"]["p50"] > 0


@pytest.mark.parametrize("body,status,words", [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b"[1, 2, 3, 4, 5]", 422, "JSON object"),
    (b'{"y": [1, 2, 3, 4, 5]}', 422, 'key "x"'),
    (b'{"x": "12345"}', 422, "list of 5 numbers"),
    (b'{"x": [1, 2, 3]}', 422, "holds 3 values"),
    (b'{"x": [[1], 2, 3, 4, 5]}', 422, "only numbers"),
    (b'{"x": [1, "2", 3, 4, 5]}', 422, "only numbers"),
    (b'{"x": [true, 2, 3, 4, 5]}', 422, "only numbers"),
    (b'{"x": [NaN, 2, 3, 4, 5]}', 422, "NaN or infinity"),
    (b'{"x": [1e999, 2, 3, 4, 5]}', 422, "NaN or infinity"),
    (b'{"x": [' + b"1," * 600_000 + b"1]}", 413, "limit"),
], ids=["malformed", "not-utf8", "not-object", "no-x", "x-string", "short", "nested", "string-value", "bool",
        "nan", "inf", "too-large"])
def test_bad_input_gets_a_4xx_with_a_message_and_the_server_keeps_serving(model, body, status, words):
    with serving(app_for(model)) as url:
        r = post(url, body)
        assert r.status_code == status and words in r.json()["error"], r.text
        assert post(url, json.dumps({"x": [0] * D_IN})).status_code == 200
    assert model.rows == 1, "bad requests never reach the model"


def test_a_model_error_is_a_500_with_its_message(model):
    model.fail = True
    with serving(app_for(model)) as url:
        r = post(url, json.dumps({"x": [0] * D_IN}))
        assert r.status_code == 500 and "weights on fire" in r.json()["error"]
        model.fail = False
        assert post(url, json.dumps({"x": [0] * D_IN})).status_code == 200


def test_overload_answers_503_and_the_admitted_requests_complete(model):
    model.gate.clear()  # the model stalls: the queue fills

    async def burst(url):
        async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
            tasks = [asyncio.ensure_future(client.post(url + "/predict", json={"x": [1] * D_IN})) for _ in range(12)]

            async def accounted():  # each request is in the stalled model, in the queue or refused
                m = (await client.get(url + "/metrics")).json()
                return model.entered + m["queue_depth"] + m["rejected"] == 12

            for _ in range(2000):  # (a bound only against a hang)
                if await accounted():
                    break
                await asyncio.sleep(0.01)
            model.gate.set()  # only now: no request can arrive after the model resumed, however slow the machine
            return await asyncio.gather(*tasks)

    with serving(app_for(model, max_batch=1, max_queue=3)) as url:
        codes = sorted(r.status_code for r in asyncio.run(burst(url)))
        m = client.metrics(url)
    assert codes.count(503) >= 12 - 1 - 3 and set(codes) <= {200, 503}
    assert codes.count(200) == m["served"] >= 1 and m["rejected"] == codes.count(503)


def test_a_client_that_gives_up_is_dropped_not_computed(model):
    # a delay far beyond the test: the request leaves the queue only by being dropped, however slow the machine
    with serving(app_for(model, max_delay_s=60.0, max_batch=4)) as url:
        with pytest.raises(httpx.ReadTimeout):  # sent in full, then the client stops waiting for the answer
            httpx.post(url + "/predict", json={"x": [1] * D_IN}, trust_env=False, timeout=httpx.Timeout(30, read=0.2))
        m = wait_until(lambda: (m := client.metrics(url))["dropped"] and m, "the server to notice the hang-up")
        assert m["dropped"] == 1 and m["served"] == 0 and m["queue_depth"] == 0
    assert model.rows == 0


def test_config_retunes_the_batcher_and_refuses_nonsense(model, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(client, "time", clock)  # wait_idle's clock and sleeps: what it waits is exact
    with serving(app_for(model)) as url:
        assert client.configure(url, 2, 0.0) == {"max_batch": 2, "max_delay_ms": 0.0}
        m = client.metrics(url)
        assert m["max_batch"] == 2 and m["max_delay_ms"] == 0.0
        r = httpx.post(url + "/config", json={"max_batch": 99}, trust_env=False)
        assert r.status_code == 422 and "max_batch" in r.json()["error"]
        # an idle server is idle at once: wait_idle returns after settle_s of empty queue, polling every 20 ms
        assert client.wait_idle(url, settle_s=0.1) == pytest.approx(0.1, abs=0.02 + 1e-9)
        assert clock.slept and set(clock.slept) == {0.02} and len(clock.slept) <= 6


def test_wait_idle_waits_for_a_quiet_queue_and_gives_up_after_its_timeout(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(client, "time", clock)
    depths = iter([3, 2, 0, 1, 0, 0, 0, 0, 0])  # one poll every 20 ms: quiet from 80 ms on
    monkeypatch.setattr(client, "metrics", lambda url: {"queue_depth": next(depths)})
    # settle_s=0.05: the queue must stay empty from 80 ms to at least 130 ms; the poll at 140 ms sees that
    assert client.wait_idle("http://127.0.0.1:1", settle_s=0.05) == pytest.approx(0.14)
    assert len(clock.slept) == 7 and next(depths) == 0  # 8 polls, no more
    monkeypatch.setattr(client, "metrics", lambda url: {"queue_depth": 1})  # never idle: stops at timeout_s
    assert client.wait_idle("http://127.0.0.1:1", timeout_s=0.11, settle_s=0.05) == pytest.approx(0.12)


def test_launch_starts_a_real_server_process_and_stops_it_cleanly():
    with client.launch("--d-in", "4", "--width", "8", "--depth", "1", "--d-out", "3", "--threads", "1",
                       "--max-batch", "4", "--max-delay-ms", "1") as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        r = httpx.post(srv.url + "/predict", json={"x": [0.5, -1, 2, 0]}, trust_env=False, timeout=10)
        assert r.status_code == 200 and len(r.json()["y"]) == 3
        ref = torch.tensor(r.json()["y"])
        from labkit.serving.model import make_model
        with torch.no_grad():
            want = make_model(4, 8, 1, 3, seed=0)(torch.tensor([[0.5, -1, 2, 0]]))[0]
        torch.testing.assert_close(ref, want, rtol=1e-5, atol=1e-6)
    assert srv.proc.returncode in (0, -15) and srv.drained, srv.log()  # uvicorn re-raises SIGTERM once drained


def test_launch_reports_a_server_that_fails_to_start():
    with pytest.raises(RuntimeError, match="before listening"):
        with client.launch("--dtype", "float64"):
            pass


def test_answers_are_not_held_back_by_nagles_algorithm(model):
    """Without TCP_NODELAY on the server's sockets every keep-alive answer waited ~40 ms for a delayed ACK.

    Checked where it is decided, on the server's end of the connection (a timed round trip passed or failed
    with the machine's load); the round trip itself is measured by tests/speed_checks.py (server_round_trip)."""
    import socket

    with uvicorn_serving(app_for(model, max_delay_s=0.0)) as (url, srv):
        with httpx.Client(trust_env=False, timeout=10) as client:
            for _ in range(2):  # the same keep-alive connection, twice
                assert client.post(url + "/predict", json={"x": [1] * D_IN}).status_code == 200
            socks = [p.transport.get_extra_info("socket") for p in list(srv.server_state.connections)]
            assert len(socks) == 1, f"{len(socks)} connections open for one keep-alive client"
            assert socks[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), "Nagle's algorithm is on"


def test_under_load_the_server_batches_and_outruns_one_request_per_model_call(model):
    """Requests that arrive while the model runs wait together and leave as one batch: 2 model calls for 41 requests.

    The model is held until all of them are queued, so the batches formed do not depend on the machine's speed; the
    requests per second this buys are measured by notebook 12 (batching_multiplies_throughput) and tests/speed_checks.py
    (server_load)."""
    n = 41
    model.gate.clear()

    async def load(url):
        async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
            def send(i):
                return asyncio.ensure_future(client.post(url + "/predict", json={"x": [i, 1, 0, 0, 0]}))

            async def depth():
                return (await client.get(url + "/metrics")).json()["queue_depth"]

            async def until(ok):
                for _ in range(2000):  # (a bound only against a hang)
                    if await ok():
                        return
                    await asyncio.sleep(0.01)

            first = send(0)

            async def first_in_model():
                return model.entered == 1

            await until(first_in_model)  # the first request runs alone, and holds the model
            rest = [send(i) for i in range(1, n)]

            async def all_queued():
                return await depth() == n - 1

            await until(all_queued)
            model.gate.set()
            return await asyncio.gather(first, *rest)

    with serving(app_for(model, max_batch=64, max_delay_s=0.002, max_queue=4096)) as url:
        answers = asyncio.run(load(url))
        m = client.metrics(url)
    assert [r.json()["y"] for r in answers] == [[3.0 * i, 3.0] for i in range(n)]  # each caller gets its own row
    assert m["served"] == n and m["batch_sizes"] == {"1": 1, str(n - 1): 1}, m
    assert model.entered == 2 and m["bucket_sizes"] == {"1": 1, "64": 1}  # 40 requests padded to the 64 bucket


def test_a_launched_server_answers_a_load_run_in_the_batches_it_reports():
    """The real process (stand-in model taking 2 ms per call) under an open-loop load: every request answered once.

    Its requests per second (over 750, 1.5x one request per 2 ms call, on a quiet machine) are a benchmark's,
    not a unit test's: tests/speed_checks.py (server_load)."""
    from labkit.serving import loadgen

    body = json.dumps({"x": [0.5] * 8}).encode()
    with client.launch("--fake-ms", "2", "--d-in", "8", "--d-out", "2", "--max-batch", "64",
                       "--max-delay-ms", "2", "--max-queue", "4096") as srv:
        res = loadgen.run(srv.url, rate=1500, n=3000, payload=lambda i: body, max_s=2.0, timeout_s=60)
        y = httpx.post(srv.url + "/predict", content=body, trust_env=False, timeout=10).json()["y"]
        m = client.metrics(srv.url)
    assert y == [4.0, 4.0]
    assert res.ok == res.sent > 0 and res.errors == res.rejected == res.timeouts == 0, res.summary()
    # every answered request left in exactly one of the batches the server says it formed, none over max_batch
    assert sum(k * v for k, v in res.batch_sizes.items()) == res.sent and max(res.batch_sizes) <= 64
    assert m["served"] == res.sent + 1


@pytest.mark.parametrize("x", [[1, 2, 3, 4, 10**400], [1, 2, 3, 4, 1e39]], ids=["huge-int", "beyond-float32"])
def test_numbers_a_float32_cannot_hold_get_a_422(model, x):
    with serving(app_for(model)) as url:
        r = post(url, json.dumps({"x": x}))
    assert r.status_code == 422 and "float32" in r.json()["error"] and model.rows == 0


def test_launch_stops_the_server_when_the_block_raises():
    with pytest.raises(KeyError):
        with client.launch("--fake-ms", "0", "--d-in", "4", "--max-batch", "2") as srv:
            proc = srv.proc
            raise KeyError("a notebook cell failed")
    assert proc.poll() is not None and srv.drained, srv.final_log
