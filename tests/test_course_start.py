"""`python3 course.py start`, as the README says: JupyterLab serves the index, every notebook and exercise."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from labkit.paths import child_env

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_links import ROOT, course_links  # noqa: E402

pytest.importorskip("jupyterlab")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """course.py start (no browser, a free port), its printed URL, and its output; stopped afterwards."""
    home = tmp_path_factory.mktemp("home")
    env = child_env(ROOT, JUPYTER_RUNTIME_DIR=str(home / "runtime"), JUPYTER_CONFIG_DIR=str(home / "config"))
    log = open(home / "out.txt", "w+")
    proc = subprocess.Popen([sys.executable, str(ROOT / "course.py"), "start", "--", "--no-browser",
                             f"--port={_free_port()}", "--ServerApp.port_retries=0"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url, deadline = None, time.monotonic() + 180
    while url is None and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        m = re.search(r"^\s+(http://\S+/lab/tree/notebooks/index\.ipynb\?token=\w+)$",
                      (home / "out.txt").read_text(), flags=re.M)
        url = m and m.group(1)
    try:
        assert url, f"course.py start printed no URL:\n{(home / 'out.txt').read_text()[-3000:]}"
        yield url, (home / "out.txt")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read()


def test_the_printed_url_opens_the_index(server):
    url, _ = server
    status, page = _get(url)
    assert status == 200 and b"JupyterLab" in page


def test_root_gets_allow_root_with_a_notice(server):
    _, out = server
    said = "passing --allow-root" in out.read_text()
    assert said == (os.geteuid() == 0)


def test_the_index_and_every_linked_notebook_and_exercise_are_served(server):
    url, _ = server
    base, token = url.split("/lab/tree/")[0], url.split("token=")[1]
    wanted = sorted(p.relative_to(ROOT).as_posix() for p in course_links())
    assert "notebooks/index.ipynb" in wanted and any(w.startswith("exercises/") for w in wanted)
    for rel in wanted:  # the Contents API is what JupyterLab opens a file through
        status, body = _get(f"{base}/api/contents/{rel}?token={token}")
        assert status == 200 and json.loads(body)["path"] == rel, rel
