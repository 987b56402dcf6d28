"""The course's facts, in one place: where it lives, its notebooks in order, and a machine's name as a file name."""
from __future__ import annotations

import os
import re
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
