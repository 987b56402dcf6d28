"""Submissions: one folder or one notebook per student; which notebook is which; their code cells.

Nothing here follows a link or opens anything but a regular file: a submitted link, FIFO or device
is reported in the student's notes and not graded. Each submitted folder or file is one student,
with an id that is safe as a file name and unique (names that sanitise alike get a suffix made from
the original name, so they are never merged), and the original name kept for the CSV.
"""
from __future__ import annotations

import ast
import os
import re
import stat
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from labkit.grading import safeio

MAX_ENTRIES = 5000  # files and folders looked at in one student's folder


@dataclass
class Submission:
    student: str  # unique, safe as a file name
    original: str  # the folder or file name as submitted
    notebooks: list[Path]
    notes: list[str] = field(default_factory=list)  # what was skipped, and why


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "student"


def _notebooks_in(folder: Path) -> tuple[list[Path], list[str]]:
    """The regular .ipynb files under `folder` (no link followed, checkpoints skipped) and notes on the rest."""
    found, notes, seen = [], [], 0
    for root, dirs, files in os.walk(folder):  # os.walk does not follow links to folders
        dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints" and not d.startswith("."))
        for name in sorted(files + [d for d in os.listdir(root) if os.path.islink(os.path.join(root, d))
                                    and d not in files]):
            seen += 1
            if seen > MAX_ENTRIES:
                notes.append(f"more than {MAX_ENTRIES} files: the rest were not looked at")
                return sorted(found), notes
            path = Path(root) / name
            rel = path.relative_to(folder)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                if name.endswith(".ipynb"):
                    found.append(path)
            elif name.endswith(".ipynb") or stat.S_ISLNK(st.st_mode):
                notes.append(f"{rel}: {safeio.kind(st.st_mode)}, not graded")
    return sorted(found), notes


def find_submissions(root: Path) -> list[Submission]:
    """One Submission per folder or .ipynb (or link or special file named like one) directly inside `root`."""
    found = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        st = entry.stat(follow_symlinks=False)
        path = Path(entry.path)
        if stat.S_ISDIR(st.st_mode):
            nbs, notes = _notebooks_in(path)
            found.append(Submission(entry.name, entry.name, nbs, notes))
        elif entry.name.endswith(".ipynb") and stat.S_ISREG(st.st_mode):
            found.append(Submission(path.stem, entry.name, [path]))
        elif entry.name.endswith(".ipynb") or stat.S_ISLNK(st.st_mode):
            found.append(Submission(path.stem if entry.name.endswith(".ipynb") else entry.name, entry.name, [],
                                    [f"{entry.name} is {safeio.kind(st.st_mode)}: not graded (submit a regular "
                                     f"file or folder)"]))
    groups: dict[str, list[Submission]] = {}
    for s in found:
        s.student = safe_name(s.student)
        groups.setdefault(s.student.casefold(), []).append(s)
    taken = {s.student.casefold() for s in found}
    for group in groups.values():
        if len(group) < 2:
            continue
        for s in group:  # never merged: each gets a suffix from its original name, the same in every shard
            base = f"{s.student}-{zlib.crc32(s.original.encode('utf-8', 'surrogateescape')):08x}"
            sid, n = base, 1
            while sid.casefold() in taken:
                n += 1
                sid = f"{base}-{n}"
            taken.add(sid.casefold())
            s.notes.append(f"another submission's name ({', '.join(repr(o.original) for o in group if o is not s)}) "
                           f"sanitises to the same id: this one is {sid}")
            s.student = sid
    return found


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """A submitted notebook, read only if it is a regular file of sensible size."""
    return nbformat.reads(safeio.read_bytes(path, safeio.MAX_NOTEBOOK_BYTES).decode("utf-8"), as_version=4)


def _exercise_of(path: Path, names: list[str]) -> str | None:
    try:
        meta = read_notebook(path).get("metadata", {}).get("labkit", {}).get("exercise")
    except Exception:
        meta = None
    stem = path.stem
    return meta if meta in names else next(
        (n for n in names if n == stem), None) or next((n for n in names if n in stem), None) or next(
        (n for n in names if re.match(r"\d\d", stem) and n[:2] == stem[:2]), None)


def _code(path: Path) -> list[str] | None:
    try:
        return [src.strip() for _, src in extract_code(path)[0]]
    except Exception:
        return None


def match_notebooks(paths: list[Path], names: list[str],
                    released: dict[str, Path] | None = None) -> tuple[dict[str, Path], list[str]]:
    """Which submitted notebook is which exercise (by the metadata `labkit exercises build` wrote, else by
    name). Several for one exercise: the one whose code differs from the released notebook in `released`."""
    candidates: dict[str, list[Path]] = {}
    notes = []
    for path in paths:
        name = _exercise_of(path, names)
        if name is None:
            notes.append(f"{path.name}: not one of the graded notebooks, ignored")
        else:
            candidates.setdefault(name, []).append(path)
    matched: dict[str, Path] = {}
    for name, found in candidates.items():
        if len(found) == 1:
            matched[name] = found[0]
            continue
        stub = _code(released[name]) if released and name in released else None
        edited = [p for p in found if stub is None or _code(p) != stub]
        pool = edited or found
        pick = next((p for p in pool if p.stem == name), pool[0])
        why = ("the others are the released notebook, unedited" if stub is not None and len(edited) == 1 else
               "none differs from the released notebook" if not edited else
               "several were edited: the one named like the exercise, else the first by name")
        matched[name] = pick
        notes.append(f"{len(found)} notebooks for {name} ({', '.join(p.name for p in found)}): graded {pick.name} "
                     f"({why})")
    return matched, notes


def extract_code(path: Path) -> tuple[list[list], list[str]]:
    """[code cell number, source] of each code cell; shell/magic lines become `pass` (with a note)."""
    nb = read_notebook(path)
    cells, notes, number = [], [], 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        number += 1
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        if src.lstrip().startswith("%%"):
            notes.append(f"code cell {number} skipped: a cell magic ({src.strip().splitlines()[0][:60]}); "
                         f"the grader runs plain Python only")
            continue
        lines = []
        for line in src.splitlines():
            stripped = line.lstrip()
            if stripped.startswith(("!", "%")):
                indent = line[: len(line) - len(stripped)]
                lines.append(f"{indent}pass")
                notes.append(f"code cell {number}: skipped the line `{stripped[:60]}`: the grader runs plain "
                             f"Python, not IPython magics or shell lines (use subprocess.run for commands)")
            else:
                lines.append(line)
        cells.append([number, "\n".join(lines) + "\n"])
    return cells, notes


def defines_triton_kernel(cells: list[list]) -> bool:
    """A function decorated with triton.jit (or jit) somewhere in the notebook (checked statically)."""
    for _, src in cells:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    if re.match(r"^(triton\.)?jit\b", ast.unparse(dec)):
                        return True
    return False
