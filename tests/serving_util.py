"""A uvicorn server in a background thread on a free 127.0.0.1 port, for the serving tests."""
import contextlib
import threading
import time

from labkit.serving.server import bound_socket


@contextlib.contextmanager
def uvicorn_serving(app):
    """(url, the uvicorn.Server): the server's state (its open connections) for tests that inspect it."""
    import uvicorn

    sock = bound_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the test server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


@contextlib.contextmanager
def serving(app):
    with uvicorn_serving(app) as (url, _):
        yield url


def wait_until(condition, what: str, timeout_s: float = 20.0):
    """Poll `condition()` until it returns something truthy (returned); the timeout only stops a hang."""
    deadline = time.monotonic() + timeout_s
    while not (got := condition()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)
    return got
