"""The HTTP inference server around the batcher (notebook 12): Starlette under uvicorn, on 127.0.0.1 only.

    POST /predict  {"x": [d_in numbers]}  -> {"y": [d_out numbers]}   (4xx with a message on bad input,
                                                                       503 when the queue is full)
    GET  /metrics  queue depth, batch-size histogram, latency percentiles, counts
    POST /config   {"max_batch": 8, "max_delay_ms": 2.0}  retune the batcher (and reset /metrics)

`python -m labkit.serving.server --device cuda ...` starts one (the OS picks a free port; it prints the URL);
labkit.serving.client starts it from a notebook as a subprocess and talks to it.

Used by: notebook 12 (a subprocess, started by labkit.serving.client).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import socket
import sys
from typing import Callable

import torch

from labkit.serving.batcher import Batcher, Closed, QueueFull, Stats

HOST = "127.0.0.1"
READY = "labkit.serving.server listening on "  # then the URL: labkit.serving.client waits for it
DRAINED = "labkit.serving.server drained"  # printed on a clean exit, after the queued requests were answered
MAX_BODY = 1 << 20  # bytes
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _error(status: int, message: str):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status)


def parse_input(body: bytes, d_in: int) -> torch.Tensor | tuple[int, str]:
    """The request's input as a float32 tensor [d_in], or (status, message) saying what is wrong."""
    if len(body) > MAX_BODY:
        return 413, f"request body is {len(body)} bytes; the limit is {MAX_BODY}"
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return 400, f"the body is not valid JSON ({err}); send {{\"x\": [{d_in} numbers]}}"
    if not isinstance(doc, dict) or "x" not in doc:
        return 422, f"send a JSON object with key \"x\": a list of {d_in} numbers"
    x = doc["x"]
    if not isinstance(x, list):
        return 422, f"\"x\" must be a list of {d_in} numbers, not {type(x).__name__}"
    if len(x) != d_in:
        return 422, f"\"x\" holds {len(x)} values; this model takes exactly {d_in}"
    if not set(map(type, x)) <= {int, float}:  # (map runs in C: this check costs ~2 us per request, not ~15)
        bad = next(v for v in x if type(v) not in (int, float))
        return 422, f"\"x\" must hold only numbers; found {type(bad).__name__} {json.dumps(bad)[:40]}"
    try:
        finite = all(map(math.isfinite, x)) and max(map(abs, x)) <= FLOAT32_MAX
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite:
        return 422, "\"x\" holds NaN or infinity, or a value beyond float32's range; send finite numbers"
    return torch.tensor(x, dtype=torch.float32)


async def _client_gone(request) -> None:
    """Returns when the client disconnects (the body has been read, so the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def make_app(run_batch: Callable[[torch.Tensor], torch.Tensor], d_in: int, max_batch: int = 32,
             max_delay_s: float = 0.002, max_queue: int = 1024, buckets: tuple[int, ...] | None = None,
             on_ready: Callable[[], None] | None = None, threaded: bool = True):
    """The Starlette app: a Batcher started and drained with the app's lifespan."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    batcher = Batcher(run_batch, max_batch=max_batch, max_delay_s=max_delay_s, max_queue=max_queue,
                      buckets=buckets, threaded=threaded)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        batcher.start()
        if on_ready:
            on_ready()
        try:
            yield
        finally:
            await batcher.close(drain=True)
            print(f"{DRAINED}: {batcher.stats.served} served, {batcher.stats.rejected} rejected",
                  flush=True)

    async def predict(request):
        x = parse_input(await request.body(), d_in)
        if isinstance(x, tuple):
            return _error(*x)
        work = asyncio.ensure_future(batcher.submit(x))
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not work.done():  # the client hung up: drop its request (not computed if still queued)
            work.cancel()
            return _error(499, "client closed the connection")
        try:
            y = work.result()
        except (QueueFull, Closed) as err:
            return JSONResponse({"error": str(err)}, status_code=503, headers={"Retry-After": "1"})
        except Exception as err:  # the model failed: say so, keep serving
            return _error(500, f"the model raised {type(err).__name__}: {err}")
        return JSONResponse({"y": y.tolist()})

    async def metrics(request):
        snap = batcher.stats.snapshot()
        snap.update(queue_depth=batcher.queue_depth, max_batch=batcher.max_batch,
                    max_delay_ms=batcher.max_delay_s * 1e3, max_queue=batcher.max_queue)
        return JSONResponse(snap)

    async def config(request):
        try:
            doc = json.loads(await request.body())
            max_b = int(doc.get("max_batch", batcher.max_batch))
            delay = float(doc.get("max_delay_ms", batcher.max_delay_s * 1e3))
            if not (1 <= max_b <= batcher.buckets[-1]) or not (0 <= delay < 10_000):
                raise ValueError(f"max_batch must be in 1..{batcher.buckets[-1]} and max_delay_ms in [0, 10000)")
        except (ValueError, TypeError, AttributeError, json.JSONDecodeError) as err:
            return _error(422, f"send {{\"max_batch\": int, \"max_delay_ms\": float}}: {err}")
        batcher.max_batch, batcher.max_delay_s = max_b, delay / 1e3
        batcher.stats = Stats()
        return JSONResponse({"max_batch": max_b, "max_delay_ms": delay})

    app = Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route("/metrics", metrics),
                            Route("/config", config, methods=["POST"])], lifespan=lifespan)
    app.state.batcher = batcher
    return app


def bound_socket() -> socket.socket:
    """A TCP socket on 127.0.0.1 at a port the OS picked.

    Made with proto IPPROTO_TCP so that asyncio sets TCP_NODELAY on every accepted connection (it checks
    the proto): with Nagle's algorithm on, each answer's body waited ~40 ms for the client's delayed ACK.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    return sock


def serve(app_factory: Callable[[Callable[[], None]], object], log_level: str = "warning") -> None:
    """Run an app under uvicorn on a free loopback port; print READY + URL once it accepts requests."""
    import uvicorn

    sock = bound_socket()
    url = f"http://{HOST}:{sock.getsockname()[1]}"
    app = app_factory(lambda: print(READY + url, flush=True))
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=10,
                                          backlog=4096, access_log=False))
    server.run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Serve labkit's model over HTTP on 127.0.0.1 (a free port).")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--d-in", type=int, default=64)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--d-out", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-delay-ms", type=float, default=2.0)
    ap.add_argument("--max-queue", type=int, default=1024)
    ap.add_argument("--graphs-upto", type=int, default=0, help="capture CUDA graphs for buckets up to this size")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--inline", action="store_true", help="run the model in the event loop, not a worker thread")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--fake-ms", type=float, default=None,
                    help="serve a stand-in that sleeps this many ms per batch, whatever its size (tests the HTTP path)")
    args = ap.parse_args(argv)
    from labkit.serving.batcher import bucket_sizes
    from labkit.serving.model import FixedTime, Runner, make_model

    if args.threads:
        torch.set_num_threads(args.threads)
    sys.setswitchinterval(2e-4)  # the model thread gets the GIL back from the event loop within 0.2 ms, not 5
    buckets = bucket_sizes(args.max_batch)
    if args.fake_ms is not None:
        runner = FixedTime(args.fake_ms, args.d_out)
    else:
        dtype = getattr(torch, args.dtype)
        model = make_model(args.d_in, args.width, args.depth, args.d_out, args.seed, device=args.device)
        runner = Runner(model, args.device, dtype, compile=args.compile,
                        graphs=[b for b in buckets if b <= args.graphs_upto])
        runner.warm(buckets)  # every bucket's first (slow) run happens before the server listens
    serve(lambda ready: make_app(runner, args.d_in, args.max_batch, args.max_delay_ms / 1e3, args.max_queue,
                                 buckets, on_ready=ready, threaded=not args.inline))


if __name__ == "__main__":
    main()
