"""Reading and writing notebooks, through nbformat: the one place labkit touches .ipynb files."""
from __future__ import annotations

from pathlib import Path

import nbformat


def read(path: Path | str) -> nbformat.NotebookNode:
    """A notebook as nbformat v4 reads it (a dict with attribute access)."""
    return nbformat.read(str(path), as_version=4)


def dumps(nb: dict) -> str:
    """The text Jupyter writes (one-space indent, sorted keys, sources kept as one string, final newline)."""
    text = nbformat.writes(nbformat.from_dict(nb), split_lines=False)
    return text if text.endswith("\n") else text + "\n"


def write(nb: dict, path: Path | str) -> None:
    Path(path).write_text(dumps(nb), encoding="utf-8")


def source(cell: dict) -> str:
    """A cell's source as one string (files may store it as a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src
