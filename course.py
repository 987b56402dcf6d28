#!/usr/bin/env python3
"""Set up and start the course, or run its tests: the two commands the README opens with.

    python3 course.py start        # install into .venv, serve the course in JupyterLab, open its index
    python3 course.py test         # install into .venv, run unit tests + every notebook (nbval)
    python3 course.py test --full  # the same at full problem sizes (on a GPU host)

If the running Python already has everything the course needs (a GPU host with its own
torch and the notebook tools on PYTHONPATH), it is used as it is and nothing is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
TORCH_TESTED = "torch==2.13.0"  # installed only where no torch is present
NEEDED = ["torch", "numpy", "matplotlib", "ipykernel", "ipywidgets", "nbval", "papermill", "tqdm", "pytest"]
if sys.platform.startswith("linux"):
    NEEDED.append("triton")
NOTEBOOK_DIRS = ["notebooks", "solutions", "exercises"]


def has_everything(python: str, extra: list[str]) -> bool:
    code = "import importlib.util,sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))"
    return subprocess.run([python, "-c", code, *NEEDED, *extra], cwd=ROOT).returncode == 0


def venv_python() -> str:
    return str(VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))


def ensure_env(extra: list[str]) -> str:
    """The Python to run the course with, installing into .venv only what is missing."""
    if has_everything(sys.executable, extra):
        return sys.executable
    if not Path(venv_python()).exists():
        print(f"course: creating {VENV} (it sees this Python's packages, so a GPU build of torch is reused)")
        venv.EnvBuilder(with_pip=True, system_site_packages=True).create(VENV)
    py = venv_python()
    stamp = VENV / ".installed"
    wanted = hashlib.sha1((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == wanted and has_everything(py, extra):
        return py
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    if subprocess.run([py, "-c", "import torch"], capture_output=True).returncode != 0:
        print(f"course: installing {TORCH_TESTED}")
        subprocess.run([*pip, TORCH_TESTED], check=True)
    print("course: installing labkit and the notebook tools (a minute or two the first time)")
    subprocess.run([*pip, "-e", str(ROOT)], check=True)
    stamp.write_text(wanted)
    return py


def run_env(full: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    # MPLBACKEND stays unset: notebook kernels keep Jupyter's inline backend, so their plots run as a
    # student's do (the pytest process itself plots with Agg: tests/conftest.py)
    env["LABKIT_QUICK"] = "0" if full else env.get("LABKIT_QUICK", "1")
    env["LABKIT_CLAIMS_STRICT"] = "1"  # a failed claim fails its notebook's test (labkit/claims.py)
    return env


def test(args: argparse.Namespace) -> int:
    py = ensure_env([])
    chosen = [a for a in args.pytest_args if not a.startswith("-")]
    options = [a for a in args.pytest_args if a.startswith("-")]
    paths = chosen or ["tests"] + [d for d in NOTEBOOK_DIRS if any((ROOT / d).glob("*.ipynb"))]
    cmd = [py, "-m", "pytest", *paths, "--nbval-lax", "--nbval-current-env",
           f"--nbval-cell-timeout={3600 if args.full else 600}", "-p", "no:cacheprovider", *options]
    print("course:", " ".join(cmd[1:]))
    return subprocess.run(cmd, cwd=ROOT, env=run_env(args.full)).returncode


INDEX = "notebooks/index.ipynb"


def jupyter_command(py: str, extra: list[str], is_root: bool) -> list[str]:
    """JupyterLab serving the whole repository (so ../exercises/ links resolve), opened at the index."""
    cmd = [py, "-m", "jupyterlab", INDEX, f"--ServerApp.root_dir={ROOT}", *extra]
    if is_root and "--allow-root" not in extra:
        cmd.append("--allow-root")
    return cmd


def _server_url(py: str, pid: int, proc: subprocess.Popen, wait_s: float = 120) -> str | None:
    """The URL (with its token) of the JupyterLab started as `pid`, read from its runtime file once it is up."""
    out = subprocess.run([py, "-c", "from jupyter_core.paths import jupyter_runtime_dir as d; print(d())"],
                         capture_output=True, text=True)
    info_file = Path(out.stdout.strip()) / f"jpserver-{pid}.json"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            info = json.loads(info_file.read_text())
            return f"{info['url'].rstrip('/')}/lab/tree/{INDEX}?token={info['token']}"
        except (OSError, ValueError, KeyError):
            time.sleep(0.5)
    return None


def start(args: argparse.Namespace) -> int:
    py = ensure_env(["jupyterlab"])
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("test", help="run the unit tests and execute every notebook with nbval")
    t.add_argument("--full", action="store_true", help="full problem sizes (for a GPU host)")
    t.add_argument("pytest_args", nargs="*",
                   help="after --: paths to test instead of all (e.g. tests notebooks/02_transfer_cost.ipynb) "
                        "and pytest options")
    s = sub.add_parser("start", help="open the course in JupyterLab")
    s.add_argument("jupyter_args", nargs="*", help="passed on to jupyter lab (after --)")
    args = ap.parse_args()
    return test(args) if args.command == "test" else start(args)


if __name__ == "__main__":
    sys.exit(main())
