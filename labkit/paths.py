"""The course's facts, in one place: where it lives, its notebooks in order, and a machine's name as a file name."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent  # labkit/
COURSE_ROOT = PACKAGE_DIR.parent  # the folder that holds labkit/, notebooks/, solutions/ and exercises/
NOTEBOOKS_DIR = COURSE_ROOT / "notebooks"
CI_DIR = COURSE_ROOT / ".ci"


def course_notebooks(root: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The course's notebooks in order (the index is only links)."""
    return sorted(root.glob("[0-9]*.ipynb"))


def machine_slug(gpu: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': a machine's name as the file name of its data."""
    return re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower() or "none"


def child_env(root: Path | str = COURSE_ROOT, **extra: str) -> dict[str, str]:
    """This environment for a child Python: `root` first on PYTHONPATH, the entries already there kept
    (a GPU host's carried wheels live there), plus `extra` variables."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(root)]
    return {**os.environ, **extra, "PYTHONPATH": os.pathsep.join([str(root), *kept])}


def commit_label(source: dict) -> str | None:
    """A `source_commit` as one line: the short commit, '+ uncommitted changes' when the tree was dirty."""
    if not source.get("commit"):
        return None
    return source["commit"][:12] + (" + uncommitted changes" if source.get("dirty") else "")


def source_commit(root: Path = COURSE_ROOT) -> dict:
    """The commit the notebooks ran from and whether the tree had uncommitted changes (None outside git).

    LABKIT_SOURCE_COMMIT="<sha>" (or "<sha>+dirty") names them for a copy of the tree whose own git history is not
    the one it came from, e.g. a GPU host handed the working tree; it must be a full 40-digit commit."""
    given = os.environ.get("LABKIT_SOURCE_COMMIT", "").strip()
    if given:
        sha, _, mark = given.partition("+")
        if not re.fullmatch(r"[0-9a-f]{40}", sha) or mark not in ("", "dirty"):
            raise ValueError(f"LABKIT_SOURCE_COMMIT={given!r}: give a full commit, e.g. $(git rev-parse HEAD), "
                             "with '+dirty' after it when the tree had uncommitted changes")
        return {"commit": sha, "dirty": mark == "dirty"}

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}
