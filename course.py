#!/usr/bin/env python3
"""Set up and start the course, or run its tests: the two commands the README opens with.

    python3 course.py start           # install into .venv, serve the course in JupyterLab, open its index
    python3 course.py test            # install into .venv, run unit tests + every notebook (nbval)
    python3 course.py test --full     # the same at full problem sizes (on a GPU host)
    python3 course.py test --latest   # the newest versions pyproject.toml allows, in .venv-latest (drift check)
    python3 course.py book [RUN ...]  # the course as a static HTML book (build/book/html) from `labkit run` folders

.venv gets exactly the locked versions: every package in locks/course.txt (with hashes), and PyTorch and
Triton as the pair in locks/torch.toml (a GPU host keeps the PyTorch it has). `--unlocked` installs the newest
versions pyproject.toml allows instead. If the running Python already has everything the course needs (a GPU
host with its own torch and the notebook tools on PYTHONPATH), it is used as it is and nothing is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
LATEST_VENV = ROOT / ".venv-latest"
LOCK = ROOT / "locks" / "course.txt"
TORCH_PAIRS = ROOT / "locks" / "torch.toml"
BOOK_LOCK = ROOT / "locks" / "book.txt"  # the book's tools (pyproject's [book] extra): `course.py book` and the tests
BOOK_NEEDED = ["sphinx", "myst_nb", "sphinx_book_theme", "latex2mathml"]
NEEDED = ["torch", "numpy", "matplotlib", "ipykernel", "ipywidgets", "nbval", "papermill", "tqdm", "pytest"]
if sys.platform.startswith("linux"):
    NEEDED.append("triton")
NOTEBOOK_DIRS = ["notebooks", "solutions", "exercises"]


class SetupError(RuntimeError):
    """Installing the course failed: the message says what to do."""


def torch_pair(kind: str) -> dict[str, str]:
    """{"torch": ..., "triton": ...}: the pair locks/torch.toml pins for 'cpu' or 'cuda' machines."""
    return tomllib.loads(TORCH_PAIRS.read_text())[kind]


def has_everything(python: str, extra: list[str]) -> bool:
    code = "import importlib.util,sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))"
    return subprocess.run([python, "-c", code, *NEEDED, *extra], cwd=ROOT).returncode == 0


def venv_python(where: Path = VENV) -> str:
    return str(where / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))


def _pip(py: str, *args: str, what: str) -> None:
    cmd = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    if subprocess.run(cmd).returncode != 0:
        raise SetupError(f"installing {what} failed (pip's message is above). Check the network or the package "
                         f"index, then run the same command again; `{' '.join(cmd[1:])}` is what failed.")


def installed_versions(py: str, names: list[str]) -> dict[str, str | None]:
    """name -> installed version (None where missing), as the Python `py` sees them."""
    code = ("import json, sys\nfrom importlib.metadata import version, PackageNotFoundError\nout = {}\n"
            "for n in sys.argv[1:]:\n    try: out[n] = version(n)\n    except PackageNotFoundError: out[n] = None\n"
            "print(json.dumps(out))")
    done = subprocess.run([py, "-c", code, *names], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else dict.fromkeys(names)


def _stamp_of(*paths: Path) -> str:
    return hashlib.sha1(b"".join(p.read_bytes() for p in paths)).hexdigest()


def torch_outside_venv(py: str) -> bool:
    """Whether the torch that `py` imports comes from outside its venv (this machine's own build, reused)."""
    code = "import sys, torch; sys.exit(0 if torch.__file__.startswith(sys.prefix) else 3)"
    return subprocess.run([py, "-c", code], capture_output=True).returncode == 3


def install_locked(py: str) -> dict:
    """Install the locked versions into the venv of `py`; return what was installed (the stamp's record)."""
    have = installed_versions(py, ["torch", "triton"])
    record = {"lock": _stamp_of(ROOT / "pyproject.toml", LOCK, TORCH_PAIRS), "torch_from": "this machine"}
    if have["torch"] is not None and torch_outside_venv(py):
        cuda = torch_pair("cuda")
        print(f"course: keeping this machine's torch {have['torch']} and triton {have['triton']} (the GPU figures "
              f"in reference/ were measured with torch {cuda['torch']} and triton {cuda['triton']})")
    else:  # no torch yet, or one this venv holds: the locked CPU pair
        pair = torch_pair("cpu")
        wanted = [f"torch=={pair['torch']}"] + ([f"triton=={pair['triton']}"] if sys.platform.startswith("linux")
                                                else [])
        print(f"course: installing {' and '.join(wanted)} (locks/torch.toml)")
        _pip(py, *wanted, what="PyTorch")
        record["torch_from"] = "cpu"
    print("course: installing the locked notebook tools (locks/course.txt; a minute or two the first time)")
    _pip(py, "--require-hashes", "--no-deps", "-r", str(LOCK), what="the locked packages")
    _pip(py, "--no-deps", "--no-build-isolation", "-e", str(ROOT), what="labkit")
    return record


def install_unlocked(py: str, upgrade: bool) -> dict:
    """Install the newest versions pyproject.toml allows (for --unlocked and --latest)."""
    print("course: installing the newest versions pyproject.toml allows (not the lock)")
    _pip(py, *(["--upgrade", "--upgrade-strategy", "eager"] if upgrade else []), "-e", f"{ROOT}[dev,book]",
         what="labkit and its dependencies")
    return {"lock": "unlocked " + _stamp_of(ROOT / "pyproject.toml"), "torch_from": "newest allowed"}


def show_versions(py: str) -> None:
    v = installed_versions(py, ["torch", "triton", "jupyterlab", "nbval", "papermill"])
    print("course: using " + ", ".join(f"{k} {v[k] or 'not installed'}" for k in v))


def ensure_env(extra: list[str], unlocked: bool = False, where: Path = VENV, upgrade: bool = False,
               book: bool = False) -> str:
    """The Python to run the course with, installing into `where` what the lock (or --unlocked) says; with `book`,
    the book's tools too (locks/book.txt): the running Python is then used as it is only if it has them."""
    if where == VENV and not unlocked and has_everything(sys.executable, extra) and (
            not book or has_everything(sys.executable, BOOK_NEEDED)):
        return sys.executable
    if not Path(venv_python(where)).exists():
        print(f"course: creating {where} (it sees this Python's packages, so a GPU build of torch is reused)")
        venv.EnvBuilder(with_pip=True, system_site_packages=where == VENV).create(where)
    py = venv_python(where)
    stamp = where / ".installed"
    wanted = "unlocked " + _stamp_of(ROOT / "pyproject.toml") if unlocked else _stamp_of(
        ROOT / "pyproject.toml", LOCK, TORCH_PAIRS)
    try:
        done = json.loads(stamp.read_text()) if stamp.exists() else {}
    except ValueError:
        done = {}
    if not (done.get("lock") == wanted and not upgrade and has_everything(py, extra)):
        record = install_unlocked(py, upgrade) if unlocked else install_locked(py)
        stamp.write_text(json.dumps(record))
        show_versions(py)
    if book and not unlocked:
        install_book_tools(py, where / ".installed-book")
    return py


def install_book_tools(py: str, stamp: Path) -> None:
    """The book's tools from locks/book.txt (held to locks/course.txt's versions, so the course's are unchanged)."""
    wanted = _stamp_of(BOOK_LOCK)
    if stamp.exists() and stamp.read_text() == wanted and has_everything(py, BOOK_NEEDED):
        return
    print("course: installing the book's tools (locks/book.txt: Sphinx, MyST-NB, the Sphinx Book Theme)")
    _pip(py, "--require-hashes", "--no-deps", "-r", str(BOOK_LOCK), what="the book's tools")
    stamp.write_text(wanted)


def run_env(full: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    # MPLBACKEND stays unset: notebook kernels keep Jupyter's inline backend, so their plots run as a
    # student's do (the pytest process itself plots with Agg: tests/conftest.py)
    env["LABKIT_QUICK"] = "0" if full else env.get("LABKIT_QUICK", "1")
    env["LABKIT_CLAIMS_STRICT"] = "1"  # a failed claim fails its notebook's test (labkit/claims.py)
    return env


def test_workers(py: str, full: bool, n_paths: int, options: list[str]) -> list[str]:
    """pytest-xdist's options: two worker processes (one file, or the course's notebooks and the claims tests that
    read their log, to a worker: tests/conftest.py) on a machine of two or more cores without a GPU, where the
    notebooks run in quick mode; one process on a GPU host or in a --full run (a notebook there measures the GPU, and
    two at once would measure each other), for a single path, or where LABKIT_TEST_WORKERS or -n says otherwise."""
    if any(o.startswith(("-n", "--numprocesses", "--dist")) for o in options):
        return []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    wanted = os.environ.get("LABKIT_TEST_WORKERS", "").strip()
    if wanted:
        if not wanted.isdigit():
            sys.exit(f"course: LABKIT_TEST_WORKERS={wanted!r} is not a number of worker processes (0 or 1: one "
                     f"process, as without pytest-xdist)")
        workers = int(wanted)
    elif full or n_paths < 2 or cores < 2:
        return []
    else:
        gpu = subprocess.run([py, "-c", "import torch; print(int(torch.cuda.is_available()))"],
                             capture_output=True, text=True).stdout.strip()
        if gpu != "0":
            return []
        workers = 2
    if workers < 2:
        return []
    print(f"course: {workers} test worker processes (pytest-xdist); LABKIT_TEST_WORKERS=1 runs every test in one")
    return ["-n", str(workers), "--dist", "loadfile"]


def test(args: argparse.Namespace) -> int:
    if args.latest:
        py = ensure_env([], unlocked=True, where=LATEST_VENV, upgrade=True)
    else:
        py = ensure_env([], unlocked=args.unlocked)
        if py != sys.executable and not args.unlocked:  # tests/test_tools_book.py builds a book (skipped without)
            install_book_tools(py, VENV / ".installed-book")
    chosen = [a for a in args.pytest_args if not a.startswith("-")]
    options = [a for a in args.pytest_args if a.startswith("-")]
    paths = chosen or ["tests"] + [d for d in NOTEBOOK_DIRS if any((ROOT / d).glob("*.ipynb"))]
    cmd = [py, "-m", "pytest", *paths, "--nbval-lax", "--nbval-current-env",
           f"--nbval-cell-timeout={3600 if args.full else 600}", "-p", "no:cacheprovider", "-rs", "--durations=25",
           *test_workers(py, args.full, len(paths), options), *options]
    print("course:", " ".join(cmd[1:]))
    return subprocess.run(cmd, cwd=ROOT, env=run_env(args.full)).returncode


BOOK_OUT = ROOT / "build" / "book"


def book(args: argparse.Namespace) -> int:
    """Build the HTML book from run folders, or from a quick run made first (labkit/tools/book.py builds it)."""
    py = ensure_env([], unlocked=args.unlocked, book=True)
    env = run_env(full=False)
    env.pop("LABKIT_CLAIMS_STRICT")  # a batch run records every verdict; the book shows them
    folders, ran = [Path(f).resolve() for f in args.run_folders], 0
    if not folders:
        folders = [BOOK_OUT / "run"]
        print(f"course: no run folder given: running every notebook in quick mode first (labkit run -p quick true; "
              f"about 5-10 minutes on a laptop) into {folders[0].relative_to(ROOT)}", flush=True)
        ran = subprocess.run([py, "-m", "labkit.cli", "run", "-p", "quick", "true", "-o", str(folders[0])],
                             cwd=ROOT, env=env).returncode
    code = subprocess.run([py, "-m", "labkit.cli", "book", *map(str, folders), "-o", str(args.output.resolve())],
                          cwd=ROOT, env=env).returncode
    if ran and not code:
        print("course: the book is built, but the quick run had failures (listed above; the book shows them)",
              file=sys.stderr)
    return code or ran


INDEX = "notebooks/index.ipynb"


def jupyter_command(py: str, extra: list[str], is_root: bool) -> list[str]:
    """JupyterLab serving the whole repository (so ../exercises/ links resolve), opened at the index."""
    cmd = [py, "-m", "jupyterlab", INDEX, f"--ServerApp.root_dir={ROOT}", *extra]
    if is_root and "--allow-root" not in extra:
        cmd.append("--allow-root")
    return cmd


def _runtime_dir(py: str) -> Path:
    out = subprocess.run([py, "-c", "from jupyter_core.paths import jupyter_runtime_dir as d; print(d())"],
                         capture_output=True, text=True)
    return Path(out.stdout.strip())


def _course_url(info: dict) -> str:
    return f"{info['url'].rstrip('/')}/lab/tree/{INDEX}?token={info['token']}"


def running_server(py: str) -> str | None:
    """The address of a JupyterLab already serving this course (started by course.py start), if one runs."""
    for path in sorted(_runtime_dir(py).glob("jpserver-*.json")):
        try:
            info = json.loads(path.read_text())
            os.kill(int(info["pid"]), 0)  # raises when that server is gone (a stale file)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if Path(info.get("root_dir", "")).resolve() == ROOT:
            return _course_url(info)
    return None


def _server_url(py: str, pid: int, proc: subprocess.Popen, wait_s: float = 120) -> str | None:
    """The URL (with its token) of the JupyterLab started as `pid`, read from its runtime file once it is up."""
    info_file = _runtime_dir(py) / f"jpserver-{pid}.json"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            return _course_url(json.loads(info_file.read_text()))
        except (OSError, ValueError, KeyError):
            time.sleep(0.5)
    return None


def start(args: argparse.Namespace) -> int:
    py = ensure_env(["jupyterlab"], unlocked=args.unlocked)
    already = None if args.new_server else running_server(py)
    if already:
        print(f"course: JupyterLab is already serving this course; open:\n\n    {already}\n\n"
              "course: (stop it with Ctrl-C where it runs, or pass --new-server to start another one)")
        return 0
    env = run_env(full=False)
    env.pop("LABKIT_QUICK")  # let labkit choose: quick without a GPU, full size with one
    env.pop("MPLBACKEND", None)  # inline plots
    env.pop("LABKIT_CLAIMS_STRICT")  # a student reads a failed claim's verdict; only the tests stop on it
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if is_root:
        print("course: running as root (a container?): passing --allow-root to JupyterLab")
    proc = subprocess.Popen(jupyter_command(py, args.jupyter_args, is_root), cwd=ROOT, env=env)
    try:
        url = _server_url(py, proc.pid, proc)
        if url:
            print(f"\ncourse: JupyterLab is up, serving {ROOT}. Open this address in your browser "
                  f"(the token in it is your password):\n\n    {url}\n\ncourse: Ctrl-C here stops it.\n", flush=True)
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:  # JupyterLab asks to confirm, or stops on a second Ctrl-C
                continue
    finally:
        if proc.poll() is None:
            proc.terminate()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("test", help="run the unit tests and execute every notebook with nbval")
    t.add_argument("--full", action="store_true", help="full problem sizes (for a GPU host)")
    t.add_argument("--latest", action="store_true",
                   help="test the newest versions pyproject.toml allows, in .venv-latest (to see drift early)")
    t.add_argument("pytest_args", nargs="*",
                   help="after --: paths to test instead of all (e.g. tests notebooks/02_transfer_cost.ipynb) "
                        "and pytest options")
    s = sub.add_parser("start", help="open the course in JupyterLab")
    s.add_argument("--new-server", action="store_true", help="start another JupyterLab even if one serves the course")
    s.add_argument("jupyter_args", nargs="*", help="passed on to jupyter lab (after --)")
    b = sub.add_parser("book", help="build the course as a static HTML book from executed notebooks")
    b.add_argument("run_folders", nargs="*", metavar="RUN_FOLDER",
                   help="`labkit run` output folders (one machine's; several: its shards). None: a quick run first")
    b.add_argument("-o", "--output", type=Path, default=BOOK_OUT,
                   help="where the book goes (default build/book; open build/book/html/index.html)")
    for p in (t, s, b):
        p.add_argument("--unlocked", action="store_true",
                       help="install the newest versions pyproject.toml allows instead of the locked ones")
    args = ap.parse_args(argv)
    try:
        return {"test": test, "start": start, "book": book}[args.command](args)
    except KeyboardInterrupt:
        print("\ncourse: stopped (Ctrl-C). Run the same command again to carry on; nothing was lost.",
              file=sys.stderr)
        return 130
    except SetupError as exc:
        print(f"course: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
