"""A uvicorn server in a background thread on a free 127.0.0.1 port, for the serving tests."""
import contextlib
import threading
import time

from labkit.server import bound_socket


@contextlib.contextmanager
def serving(app):
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
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
