"""The HTTP server: validation answers 4xx with a message, overload answers 503, gone clients are dropped."""
import asyncio
import json
import threading

import httpx
import pytest
import torch

from labkit import server
from serving_util import serving

D_IN = 5


class Model:
    def __init__(self):
        self.gate, self.rows, self.fail = threading.Event(), 0, False
        self.gate.set()

    def __call__(self, x):
        self.gate.wait(5)
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
        m = server.metrics(url)
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
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            tasks = [asyncio.ensure_future(client.post(url + "/predict", json={"x": [1] * D_IN})) for _ in range(12)]
            await asyncio.sleep(0.5)
            model.gate.set()
            return await asyncio.gather(*tasks)

    with serving(app_for(model, max_batch=1, max_queue=3)) as url:
        codes = sorted(r.status_code for r in asyncio.run(burst(url)))
        m = server.metrics(url)
    assert codes.count(503) >= 12 - 1 - 3 and set(codes) <= {200, 503}
    assert codes.count(200) == m["served"] >= 1 and m["rejected"] == codes.count(503)


def test_a_client_that_gives_up_is_dropped_not_computed(model):
    with serving(app_for(model, max_delay_s=0.5, max_batch=4)) as url:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + "/predict", json={"x": [1] * D_IN}, trust_env=False, timeout=0.1)
        for _ in range(100):  # the server notices the hang-up within a moment
            m = server.metrics(url)
            if m["dropped"]:
                break
            threading.Event().wait(0.02)
        assert m["dropped"] == 1 and m["served"] == 0
    assert model.rows == 0


def test_config_retunes_the_batcher_and_refuses_nonsense(model):
    with serving(app_for(model)) as url:
        assert server.configure(url, 2, 0.0) == {"max_batch": 2, "max_delay_ms": 0.0}
        m = server.metrics(url)
        assert m["max_batch"] == 2 and m["max_delay_ms"] == 0.0
        r = httpx.post(url + "/config", json={"max_batch": 99}, trust_env=False)
        assert r.status_code == 422 and "max_batch" in r.json()["error"]
        assert server.wait_idle(url, settle_s=0.1) < 2, "an idle server is idle at once"


def test_launch_starts_a_real_server_process_and_stops_it_cleanly():
    with server.launch("--d-in", "4", "--width", "8", "--depth", "1", "--d-out", "3", "--threads", "1",
                       "--max-batch", "4", "--max-delay-ms", "1") as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        r = httpx.post(srv.url + "/predict", json={"x": [0.5, -1, 2, 0]}, trust_env=False, timeout=10)
        assert r.status_code == 200 and len(r.json()["y"]) == 3
        ref = torch.tensor(r.json()["y"])
        from labkit.servemodel import make_model
        with torch.no_grad():
            want = make_model(4, 8, 1, 3, seed=0)(torch.tensor([[0.5, -1, 2, 0]]))[0]
        torch.testing.assert_close(ref, want, rtol=1e-5, atol=1e-6)
    assert srv.proc.returncode in (0, -15) and srv.drained, srv.log()  # uvicorn re-raises SIGTERM once drained


def test_launch_reports_a_server_that_fails_to_start():
    with pytest.raises(RuntimeError, match="before listening"):
        with server.launch("--dtype", "float64"):
            pass


def test_answers_are_not_held_back_by_nagles_algorithm(model):
    """Without TCP_NODELAY on the server's sockets every keep-alive answer waited ~40 ms for a delayed ACK."""
    import time

    with serving(app_for(model, max_delay_s=0.0)) as url:
        with httpx.Client(trust_env=False, timeout=10) as client:
            times = []
            for _ in range(12):
                t0 = time.perf_counter()
                assert client.post(url + "/predict", json={"x": [1] * D_IN}).status_code == 200
                times.append(time.perf_counter() - t0)
    assert sorted(times)[len(times) // 2] < 0.02, f"median round trip {sorted(times)[len(times) // 2] * 1e3:.1f} ms"


def test_under_load_the_server_batches_and_outruns_one_request_per_model_call():
    """A stand-in model taking 2 ms per call whatever the batch: unbatched, 500 requests/s is the ceiling."""
    from labkit import loadgen

    body = json.dumps({"x": [0.5] * 8}).encode()
    with server.launch("--fake-ms", "2", "--d-in", "8", "--d-out", "2", "--max-batch", "64",
                       "--max-delay-ms", "2", "--max-queue", "4096") as srv:
        res = loadgen.run(srv.url, rate=1500, n=3000, payload=lambda i: body, max_s=2.0, timeout_s=20)
        y = httpx.post(srv.url + "/predict", content=body, trust_env=False, timeout=10).json()["y"]
    assert y == [4.0, 4.0]
    assert res.ok == res.sent and res.errors == res.rejected == res.timeouts == 0, res.summary()
    assert res.mean_batch > 2, f"the server formed batches of {res.mean_batch:.2f} on average: {res.summary()}"
    assert res.throughput > 750, f"{res.throughput:.0f} requests/s, not above 1.5x one request per 2 ms call"


@pytest.mark.parametrize("x", [[1, 2, 3, 4, 10**400], [1, 2, 3, 4, 1e39]], ids=["huge-int", "beyond-float32"])
def test_numbers_a_float32_cannot_hold_get_a_422(model, x):
    with serving(app_for(model)) as url:
        r = post(url, json.dumps({"x": x}))
    assert r.status_code == 422 and "float32" in r.json()["error"] and model.rows == 0


def test_launch_stops_the_server_when_the_block_raises():
    with pytest.raises(KeyError):
        with server.launch("--fake-ms", "0", "--d-in", "4", "--max-batch", "2") as srv:
            proc = srv.proc
            raise KeyError("a notebook cell failed")
    assert proc.poll() is not None and srv.drained, srv.final_log
