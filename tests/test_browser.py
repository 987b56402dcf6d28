"""A new student's view: `course.py start`, then the printed address in a real (headless) Chromium.

Needs Debian's `chromium` (`apt-get install chromium`; `.ci/run` installs it where it can); skipped
without it. Chromium is driven over its DevTools protocol (through tornado's websocket client, which
Jupyter already installs): open the address, wait until the index has rendered, read its links,
take a screenshot (kept in $LABKIT_SCREENSHOT_DIR when that is set).
"""
import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_course_start import server  # noqa: E402,F401  (the running JupyterLab fixture)
from test_links import ROOT  # noqa: E402

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
RENDERED = "document.body.innerText.includes('Making deep learning fast on GPUs')"
LINKS = "[...document.querySelectorAll('.jp-RenderedMarkdown a')].map(a => a.getAttribute('href'))"


async def devtools_page_url(port: int) -> str:
    """The DevTools websocket address of Chromium's first page tab (it comes up within seconds)."""
    for _ in range(120):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                return next(t for t in json.load(r) if t["type"] == "page")["webSocketDebuggerUrl"]
        except (OSError, StopIteration):
            await asyncio.sleep(0.5)
    raise TimeoutError(f"Chromium's DevTools did not answer on port {port}")


class Page:
    """One Chromium tab over the DevTools protocol: evaluate JavaScript, take screenshots."""

    def __init__(self, ws, events: list | None = None):
        self.ws, self.next_id, self.events = ws, 0, events  # events: where to keep those that arrive meanwhile

    async def call(self, method: str, **params):
        self.next_id += 1
        await self.ws.write_message(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(await self.ws.read_message())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]
            if self.events is not None:
                self.events.append(msg)

    async def js(self, expression: str):
        return (await self.call("Runtime.evaluate", expression=expression, returnByValue=True))["result"].get("value")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def browser_view(server, tmp_path_factory):  # noqa: F811  (the fixture imported above)
    """Open the printed address in headless Chromium; return (rendered?, links, screenshot path)."""
    from tornado.websocket import websocket_connect

    url, _ = server
    port, profile = _free_port(), tempfile.mkdtemp()
    chrome = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                               "--hide-scrollbars", "--window-size=1400,900", f"--remote-debugging-port={port}",
                               f"--user-data-dir={profile}", "about:blank"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shot = Path(os.environ.get("LABKIT_SCREENSHOT_DIR") or tmp_path_factory.mktemp("shot")) / "index.png"
    shot.parent.mkdir(parents=True, exist_ok=True)

    async def visit():
        page = Page(await websocket_connect(await devtools_page_url(port), max_message_size=64 * 2**20))
        await page.call("Page.enable")
        await page.call("Page.navigate", url=url)
        deadline, rendered = time.monotonic() + 120, False
        while not rendered and time.monotonic() < deadline:
            await asyncio.sleep(1)
            rendered = bool(await page.js(RENDERED))
        await asyncio.sleep(2)  # let the rest of the first screen paint
        links = await page.js(LINKS) or []
        data = await page.call("Page.captureScreenshot", format="png")
        shot.write_bytes(base64.b64decode(data["data"]))
        return rendered, links

    try:
        rendered, links = asyncio.run(visit())
    finally:
        chrome.terminate()
        chrome.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)
    return rendered, links, shot


def test_the_index_renders_in_a_browser_and_its_links_open(browser_view,
                                                           server):  # noqa: F811  (the fixture imported above)
    rendered, links, _ = browser_view
    assert rendered, "the index did not render within 2 minutes"
    token = server[0].split("token=")[1]
    # JupyterLab turns each relative link into the served file's address; the student's click opens it
    served = [h.split("?")[0] for h in links if "/files/" in h]
    want = {f"notebooks/{p.name}" for p in ROOT.glob("notebooks/[0-9]*.ipynb")} | {
        f"exercises/{p.name}" for p in ROOT.glob("exercises/*.ipynb")}
    assert want <= {h.split("/files/", 1)[1] for h in served}, served
    for href in served:
        with urllib.request.urlopen(f"{href}?token={token}", timeout=30) as r:
            assert r.status == 200, href


def test_a_screenshot_of_the_index_shows_the_page(browser_view):
    from PIL import Image

    _, _, shot = browser_view
    img = Image.open(shot).convert("RGB")
    assert img.width == 1400 and img.height > 600
    colors = img.getcolors(maxcolors=1_000_000) or []
    assert len(colors) > 200, "the screenshot is nearly blank: JupyterLab did not render"
    dark = sum(n for n, (r, g, b) in colors if r + g + b < 200)
    assert dark > 1000, "no text drawn"
