"""`labkit book`: the course as an HTML book, built from a real (tiny) `labkit run` and read in headless Chromium.

The build needs the book's tools (locks/book.txt; `course.py test` installs them into .venv) and the browser
Debian's chromium, as tests/test_browser.py: each is skipped with the reason where it is missing.
LABKIT_BOOK_RUN=FOLDER builds the book from that run folder instead (a GPU run brought back), with the same checks.
"""
import asyncio
import base64
import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from labkit.paths import child_env
from labkit.tools import book, book_pages

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_browser import CHROMIUM, Page, _free_port, devtools_page_url  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HAVE_TOOLS = all(importlib.util.find_spec(m) for m in book.TOOLS)
needs_tools = pytest.mark.skipif(not HAVE_TOOLS, reason="needs the book's tools (locks/book.txt: python3 course.py "
                                                       "book installs them)")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
RUN_NOTEBOOK = "00_why_gpus"  # quick on a CPU (about 10 s), with plots and claims


def _claim(status: str, **figures) -> dict:
    return {"name": "c", "expected": "x beats y", "status": status, "note": "because", "figures": figures}


def _summary(gpu: str = "none", quick: bool = True, notebooks=(), finished="2026-11-26T01:02:03+00:00") -> dict:
    return {"finished": finished, "quick": quick, "commit": "abc123",
            "machine": {"GPU": gpu, "CPU": "Some CPU", "CPU cores": "2", "torch": "2.13.0", "triton": "3.7.1",
                        "Python": "3.12.3", "GPUs": "1", "driver": "580"},
            "notebooks": list(notebooks)}


def _entry(stem: str, claims: dict) -> dict:
    return {"notebook": f"{stem}.ipynb", "output": f"{stem}.ipynb", "status": "ok", "error": None, "duration_s": 1.5,
            "claims": claims, "figures": {}}


# --- the pages it writes: pure functions of the summaries ---

def test_the_key_figure_is_the_first_with_its_spread_and_how_many_more():
    c = _claim("held", pinned={"value": 55.123, "unit": "GB/s", "p20": 54.9, "p80": 55.3, "n": 9},
               pageable={"value": 10.0, "unit": "GB/s"})
    assert book_pages.key_figure(c) == "pinned 55.12 GB/s (p20-p80 54.9-55.3) (+1 more)"
    assert book_pages.key_figure(_claim("skipped")) == ""


def test_the_claims_table_sets_each_machine_beside_the_others_and_says_what_is_missing():
    slow = _claim("inconclusive", t={"value": 2, "unit": "ms"})
    cpu = book_pages.Run(_summary(notebooks=[_entry("00_x", {"a": slow})]), own=True)
    h100 = book_pages.Run(_summary("NVIDIA H100", quick=False, notebooks=[
        _entry("00_x", {"a": _claim("held", t={"value": 1, "unit": "ms"}), "b": _claim("failed")})]), own=False)
    h200 = book_pages.Run(_summary("NVIDIA H200", quick=False), own=False)  # holds no 00_x
    table = book_pages.claims_table("00_x", [cpu, h100, h200])
    assert table.count("<tr>") == 3  # the header and claims a and b
    assert "verdict-inconclusive" in table and "verdict-held" in table and "verdict-failed" in table
    row_b = table.split("<code>b</code>")[1]
    assert "not in this run" in row_b.split("</td>")[0]  # b: no such claim on the CPU run
    assert row_b.count("notebook not in this run") == 1  # the H200 never ran 00_x
    assert "t 2 ms" in table and "t 1 ms" in table
    assert "NVIDIA H100, full size (reference)" in table and "CPU (Some CPU), quick run (this book" in table
    assert "\n\n" not in table  # one raw HTML block for Markdown


def test_the_claims_page_lists_each_notebook_that_any_machine_ran_and_every_run():
    runs = [book_pages.Run(_summary(notebooks=[_entry("00_x", {"a": _claim("held")})]), own=True),
            book_pages.Run({**_summary("NVIDIA H200", quick=False, notebooks=[_entry("01_y", {"b": _claim("held")})]),
                            "about": "ran before 02 changed"}, own=False)]
    page = book_pages.claims_page(runs, ["00_x", "01_y", "02_z"], {"00_x": "Zero"})
    assert "[Zero](notebooks/00_x.ipynb)" in page and "(notebooks/01_y.ipynb)" in page
    assert "02_z" not in page  # no machine ran it: no table
    assert f"({book_pages.anchor('00_x')})=" in page
    assert "ran before 02 changed" in page


def test_the_banner_names_machine_versions_date_and_commits_and_says_a_cpu_run_is_one():
    cpu = book_pages.banner(_summary(), built_from="def456")
    assert "CPU quick run, not a GPU" in cpu and "torch 2.13.0" in cpu and "2026-11-26 01:02 UTC" in cpu
    assert "course commit abc123" in cpu and "def456" in cpu
    gpu = book_pages.banner(_summary("NVIDIA H100 80GB HBM3", quick=False), built_from="def456")
    assert "full-size run on NVIDIA H100 80GB HBM3" in gpu and "CPU quick run" not in gpu
    assert "not recorded" in book_pages.banner({**_summary(), "commit": None}, built_from="x")


# --- run folders: one machine's, shards merged, bad input refused with what to do ---

def _folder(path: Path, summary: dict) -> Path:
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_shards_of_one_run_merge_and_other_folders_are_refused(tmp_path):
    a = _folder(tmp_path / "one" / "a", _summary(notebooks=[_entry("00_x", {})]))
    b = _folder(tmp_path / "one" / "b", _summary(notebooks=[_entry("01_y", {})], finished="2026-11-27T00:00:00+00:00"))
    merged, executed = book.load_runs([a, b])
    assert [e["notebook"] for e in merged["notebooks"]] == ["00_x.ipynb", "01_y.ipynb"]
    assert merged["finished"].startswith("2026-11-27") and executed["01_y"] == b / "01_y.ipynb"
    with pytest.raises(book.RunFolderError, match="in two of the folders"):
        book.load_runs([a, a])
    other = _folder(tmp_path / "c", _summary("NVIDIA H200", quick=False, notebooks=[_entry("02_z", {})]))
    with pytest.raises(book.RunFolderError, match="different machines"):
        book.load_runs([a, other])
    merged, _ = book.load_runs([tmp_path / "one"])  # a folder of run folders: one notebook at a time, say
    assert len(merged["notebooks"]) == 2 and merged["notebooks"][0]["finished"].startswith("2026-11-26")


def test_a_folder_that_is_not_a_run_is_refused_saying_what_to_give(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        book.main([str(tmp_path)])
    assert exc.value.code == 2
    assert "holds no summary.json" in capsys.readouterr().err


# --- the real thing: a tiny run, built, then every page read in a browser ---

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A quick `labkit run` of one notebook (or LABKIT_BOOK_RUN's folder), and the book built from it:
    (the book's folder, the run's summary, its executed notebooks by stem)."""
    if not HAVE_TOOLS:
        pytest.skip("needs the book's tools (locks/book.txt)")
    tmp = tmp_path_factory.mktemp("book")
    env = child_env(ROOT, LABKIT_QUICK="1")
    run = Path(os.environ.get("LABKIT_BOOK_RUN") or tmp / "run")
    if not os.environ.get("LABKIT_BOOK_RUN"):
        ran = subprocess.run([sys.executable, "-m", "labkit.cli", "run", f"notebooks/{RUN_NOTEBOOK}.ipynb",
                              "-o", str(run)], cwd=ROOT, env=env, capture_output=True, text=True)
        assert (run / "summary.json").is_file(), ran.stdout + ran.stderr
    done = subprocess.run([sys.executable, "-m", "labkit.cli", "book", str(run), "-o", str(tmp / "book")],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    summary, executed = book.load_runs([run])
    return tmp / "book", summary, {s: p for s, p in executed.items() if p.is_file()}


def _images_in(executed: Path) -> int:
    return sum("image/png" in o.get("data", {}) for c in json.loads(executed.read_text())["cells"]
               for o in c.get("outputs", []))


@needs_tools
def test_the_book_builds_without_a_warning_with_every_notebook_and_exercise(built):
    out, _, executed = built
    assert (out / "warnings.txt").read_text().strip() == ""  # a broken cross-reference or bad math warns
    html = out / "html"
    pages = {p.relative_to(html).as_posix() for p in html.rglob("*.html")}
    want = {f"notebooks/{p.stem}.html" for p in (ROOT / "notebooks").glob("[0-9]*.ipynb")} | {
        f"exercises/{p.stem}.html" for p in (ROOT / "exercises").glob("*.ipynb")} | {"claims.html", "index.html"}
    assert want <= pages, sorted(want - pages)
    assert not any(p.startswith("solutions/") for p in pages)  # never the instructor's answers
    assert 'url=notebooks/index.html"' in (html / "index.html").read_text()  # the site's root opens the course
    for stem, path in executed.items():  # each of the run's plots, as an image file of the book
        assert (html / "notebooks" / f"{stem}.html").read_text().count('src="../_images/') >= _images_in(path), stem
    assert "<math" in (html / "notebooks" / "06_writing_kernels.html").read_text()  # MathML, not MathJax
    scripts = re.findall(r"<script[^>]*>", "".join(p.read_text() for p in html.rglob("*.html")))
    assert scripts and not [s for s in scripts if re.search("mathjax|require|https?:", s, re.I)]


async def _visit_all(port: int, base: str, pages: list[str]) -> dict:
    from tornado.websocket import websocket_connect

    ws = await websocket_connect(await devtools_page_url(port), max_message_size=64 * 2**20)
    events: list[dict] = []

    tab = Page(ws, events)  # keeps the events that arrive while it waits for replies
    for domain in ("Page", "Network", "Runtime", "Log"):
        await tab.call(f"{domain}.enable")
    seen = {}
    for page in pages:
        events.clear()
        await tab.call("Page.navigate", url=base + page)
        deadline = time.monotonic() + 60
        while not any(e.get("method") == "Page.loadEventFired" for e in events) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            await tab.js("1")
        broken = await tab.call("Runtime.evaluate", awaitPromise=True, returnByValue=True, expression=(
            "Promise.all([...document.images].map(i => { i.loading = 'eager'; "
            "return i.decode().then(() => i.naturalWidth > 0 ? null : i.src, () => i.src); }))"))
        seen[page] = {
            "requests": [e["params"]["request"]["url"] for e in events
                         if e.get("method") == "Network.requestWillBeSent"],
            "errors": [json.dumps(e["params"])[:300] for e in events if e.get("method") == "Runtime.exceptionThrown"
                       or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")
                       or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")],
            "broken_images": [s for s in broken["result"]["value"] if s],
            "images": await tab.js("document.images.length"),
            "links": await tab.js("[...document.querySelectorAll('a[href]')].map(a => a.href)"),
            "banner": await tab.js("(document.querySelector('.bd-header-announcement') || {}).innerText || ''"),
        }
        if page == "claims.html":
            seen[page]["tables"] = await tab.js(
                "[...document.querySelectorAll('table.claims-by-machine')].map(t => ({notebook: t.dataset.notebook, "
                "rows: t.tBodies[0].rows.length, height: t.getBoundingClientRect().height, "
                "heads: [...t.tHead.rows[0].cells].map(c => c.innerText), "
                "verdicts: [...t.querySelectorAll('.verdict')].map(v => v.innerText)}))")
            shot = await tab.call("Page.captureScreenshot", format="png")
            seen[page]["screenshot"] = base64.b64decode(shot["data"])
    return seen


@pytest.fixture(scope="module")
def browsed(built):
    """Serve the book on 127.0.0.1 and open every page in headless Chromium: what each page loaded and showed."""
    if CHROMIUM is None:
        pytest.skip("needs chromium (apt-get install chromium)")
    out = built[0]
    html = out / "html"
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    pages = sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html")  # index.html: only a redirect
                   if not p.relative_to(html).as_posix().startswith(("_static/", "_sources/", "index.html")))
    port, profile = _free_port(), tempfile.mkdtemp()
    chrome = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                               "--hide-scrollbars", "--window-size=1400,900", f"--remote-debugging-port={port}",
                               f"--user-data-dir={profile}", "about:blank"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seen = asyncio.run(_visit_all(port, base, pages))
    finally:
        chrome.terminate()
        chrome.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)
        server.shutdown()
    return html, base, seen


@needs_tools
@needs_chromium
def test_every_page_opens_without_a_console_error_and_every_image_loads(browsed, built):
    _, _, seen = browsed
    assert len(seen) >= 30  # 14 notebooks, 13 exercises, the index, claims, search...
    assert {p: v["errors"] for p, v in seen.items() if v["errors"]} == {}
    assert {p: v["broken_images"] for p, v in seen.items() if v["broken_images"]} == {}
    for stem, path in built[2].items():
        assert seen[f"notebooks/{stem}.html"]["images"] >= max(1, _images_in(path)), stem


@needs_tools
@needs_chromium
def test_no_page_requests_anything_beyond_the_book(browsed):
    _, base, seen = browsed
    outside = {p: [u for u in v["requests"] if not u.startswith((base, "data:", "blob:", "about:"))]
               for p, v in seen.items()}
    assert {p: u for p, u in outside.items() if u} == {}
    assert all(v["requests"] for v in seen.values())  # the requests were recorded at all


@needs_tools
@needs_chromium
def test_no_internal_link_is_broken(browsed):
    html, base, seen = browsed
    broken = set()
    for page, v in seen.items():
        for href in v["links"]:
            if not href.startswith(base):
                continue
            url = urllib.parse.urlsplit(href)
            path = urllib.parse.unquote(url.path)[1:] or "index.html"
            target = html / (path + "index.html" if path.endswith("/") else path)
            if not target.is_file():
                broken.add((page, href))
            elif url.fragment and target.suffix == ".html" and f'id="{url.fragment}"' not in target.read_text():
                broken.add((page, href))
    assert not broken, sorted(broken)[:20]


@needs_tools
@needs_chromium
def test_every_page_names_the_run_and_the_claims_table_renders(browsed, built):
    _, _, seen = browsed
    _, summary, executed = built
    machine = summary["machine"]
    says = "CPU quick run, not a GPU" if machine["GPU"] == "none" else f"run on {machine['GPU']}"
    commit = f"course commit {summary['commit']}" if summary.get("commit") else "not recorded by this run"
    for page, v in seen.items():
        assert says in v["banner"] and commit in v["banner"] and machine["torch"] in v["banner"], (page, v["banner"])
    tables = {t["notebook"]: t for t in seen["claims.html"]["tables"]}
    assert set(executed) <= set(tables) and len(tables) >= 14
    ours = tables[RUN_NOTEBOOK if RUN_NOTEBOOK in executed else sorted(executed)[0]]
    assert ours["rows"] >= 3 and ours["height"] > 100
    assert any("this book" in h for h in ours["heads"]) and any("H100" in h for h in ours["heads"])
    assert any("H200" in h for h in ours["heads"])
    assert set(ours["verdicts"]) <= {"HOLDS", "DIFFERS (diagnosed)", "FAILED", "INCONCLUSIVE", "SKIPPED"}
    assert "HOLDS" in ours["verdicts"]
    from PIL import Image
    import io

    img = Image.open(io.BytesIO(seen["claims.html"]["screenshot"])).convert("RGB")
    assert len(img.getcolors(maxcolors=1_000_000) or []) > 200, "the claims page screenshot is nearly blank"


def test_ci_keeps_the_quick_runs_book_and_publishes_the_gpu_runs_book_from_main_only():
    yaml = pytest.importorskip("yaml")
    jobs = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())["jobs"]
    cpu = next(j for j in jobs.values() if any(s.get("run") == "bash .ci/run" for s in j["steps"]))
    runs = [s.get("run", "") for s in cpu["steps"]]
    assert runs.index("python3 course.py book") > runs.index("bash .ci/run")
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") and s["with"]["path"] == "build/book/html"
               for s in cpu["steps"])
    gpu_artifact = next(s["with"]["name"] for s in jobs["gpu-notebooks"]["steps"] if "name" in s.get("with", {}))
    book_job = jobs["book"]
    assert book_job["needs"] == "gpu-notebooks" and "gpu" not in str(book_job["runs-on"])
    download = next(s for s in book_job["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    assert gpu_artifact.startswith(download["with"]["pattern"].rstrip("*"))
    assert any(f"course.py book {download['with']['path']}/*/run" in s.get("run", "") for s in book_job["steps"])
    assert any(s.get("uses", "").startswith("actions/upload-pages-artifact@") and s["with"]["path"] == "build/book/html"
               for s in book_job["steps"])
    pages = jobs["pages"]
    assert "refs/heads/main" in pages["if"] and "push" in pages["if"] and "book" in pages["needs"]
    assert pages["permissions"] == {"pages": "write", "id-token": "write"}
    assert [s["uses"].split("@")[0] for s in pages["steps"]] == ["actions/deploy-pages"]
