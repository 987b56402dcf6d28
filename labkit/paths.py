"""Where the course lives: the folder that holds labkit/, notebooks/, solutions/ and exercises/."""
import os
from pathlib import Path

COURSE_ROOT = Path(__file__).resolve().parent.parent


def child_env(root: Path | str = COURSE_ROOT, **extra: str) -> dict[str, str]:
    """This environment for a child Python: `root` first on PYTHONPATH, the entries already there kept
    (a GPU host's carried wheels live there), plus `extra` variables."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(root)]
    return {**os.environ, **extra, "PYTHONPATH": os.pathsep.join([str(root), *kept])}
