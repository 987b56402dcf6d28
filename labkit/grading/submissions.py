"""Submissions: one folder or one notebook per student; which notebook is which; their code cells.

Nothing here follows a link or opens anything but a regular file: a submitted link, FIFO or device
is reported in the student's notes and not graded. Each submitted folder or file is one student,
with an id that is safe as a file name and unique (names that sanitise alike get a suffix made from
the original name, so they are never merged), and the original name kept for the CSV.
"""
from __future__ import annotations

import ast
import functools
import json
import os
import re
import stat
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from labkit.grading import safeio

MAX_ENTRIES = 5000  # files and folders looked at in one student's folder
MAX_ID = 64  # characters of a student id (a feedback file's name); longer names are shortened, with a note
SKIPPED = (".ipynb_checkpoints",)  # Jupyter's own folder in the submissions folder: not a student


@dataclass
class Submission:
    student: str  # unique, safe as a file name
    original: str  # the folder or file name as submitted
    notebooks: list[Path]
    notes: list[str] = field(default_factory=list)  # what was skipped, and why


def safe_name(name: str) -> str:
    """A file-name-safe id: [A-Za-z0-9._-], starting with a letter or digit (never a spreadsheet formula or an
    option), at most MAX_ID characters (a longer one keeps a checksum of the whole name)."""
    sid = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-") or "student"
    if len(sid) > MAX_ID:
        sid = f"{sid[:MAX_ID - 9].rstrip('._-')}-{zlib.crc32(name.encode('utf-8', 'surrogateescape')):08x}"
    return sid


def _notebooks_in(folder: Path) -> tuple[list[Path], list[str]]:
    """The regular .ipynb files under `folder` (no link followed, checkpoints and hidden folders skipped, no
    recursion, at most safeio.MAX_DEPTH levels and MAX_ENTRIES entries) and notes on the rest."""
    found, notes = [], []
    walk = safeio.walk(folder, limit=MAX_ENTRIES)
    while True:
        try:
            root, dirs, files = next(walk)
        except StopIteration as stop:
            if stop.value:
                notes.append(f"{stop.value} in the folder: the rest was not looked at")
            return sorted(found), notes
        dirs[:] = [d for d in dirs if d != ".ipynb_checkpoints" and not d.startswith(".")]
        for name in files:
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


def find_submissions(root: Path) -> list[Submission]:
    """One Submission per folder or .ipynb (or link or special file named like one) directly inside `root`."""
    found = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name in SKIPPED:
            continue
        st = entry.stat(follow_symlinks=False)
        path = Path(entry.path)
        hidden = [f"{entry.name!r} starts with '.' (hidden on most systems): graded all the same; a name without "
                  f"the dot is clearer"] if entry.name.startswith(".") else []
        if stat.S_ISDIR(st.st_mode):
            nbs, notes = _notebooks_in(path)
            found.append(Submission(entry.name, entry.name, nbs, hidden + notes))
        elif entry.name.endswith(".ipynb") and stat.S_ISREG(st.st_mode):
            found.append(Submission(path.stem, entry.name, [path], hidden))
        elif entry.name.endswith(".ipynb") or stat.S_ISLNK(st.st_mode):
            found.append(Submission(path.stem if entry.name.endswith(".ipynb") else entry.name, entry.name, [],
                                    [f"{entry.name} is {safeio.kind(st.st_mode)}: not graded (submit a regular "
                                     f"file or folder)"]))
    groups: dict[str, list[Submission]] = {}
    for s in found:
        s.student = safe_name(s.student)
        if len(s.original) > MAX_ID:
            s.notes.append(f"the submission's name is {len(s.original)} characters long: its id (and feedback file) "
                           f"is {s.student}")
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


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[nbformat.NotebookNode, int]:
    data = json.loads(safeio.read_bytes(Path(path), safeio.MAX_NOTEBOOK_BYTES).decode("utf-8"))
    dropped = 0
    cells = data.get("cells") if isinstance(data, dict) else None
    for cell in cells if isinstance(cells, list) else []:
        if isinstance(cell, dict) and cell.get("outputs"):
            dropped += len(json.dumps(cell["outputs"]))
            cell["outputs"] = []
    return nbformat.reads(json.dumps(data), as_version=4), dropped


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """A submitted notebook, read only if it is a regular file of at most MAX_NOTEBOOK_BYTES, its outputs
    dropped (the grader runs the code only; a large output never costs a correct student points)."""
    return _read(path)[0]


def _read(path: Path) -> tuple[nbformat.NotebookNode, int]:
    st = os.lstat(path)
    nb, dropped = _parsed(str(path), st.st_mtime_ns, st.st_size)
    return nbformat.from_dict(nb), dropped


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


def _definitions(code: list[str] | None) -> dict[str, str]:
    """Top-level function name -> its AST (comments and layout ignored), over a notebook's code cells."""
    defs: dict[str, str] = {}
    for src in code or []:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        defs.update({n.name: ast.dump(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})
    return defs


def _pick(name: str, found: list[Path], released: dict[str, Path] | None,
          functions: dict[str, list[str]] | None) -> tuple[Path, str]:
    """Of several notebooks for one exercise, the one to grade and why (deterministic: the content and the
    names decide, never the order files were copied in): an edited one over the released stub; of several
    edited ones, the one with the most graded functions changed from the stub, then the one named like the
    exercise, then the first by name."""
    stub = _code(released[name]) if released and name in released else None
    codes = {p: _code(p) for p in found}
    edited = [p for p in found if stub is None or codes[p] != stub]
    if not edited:
        pick = next((p for p in found if p.stem == name), found[0])
        return pick, "none differs from the released notebook"
    if len(edited) == 1:
        return edited[0], "the others are the released notebook, unedited"
    fns = (functions or {}).get(name) or []
    stub_defs = _definitions(stub)
    done = {p: sum(1 for f in fns if _definitions(codes[p]).get(f) not in (None, stub_defs.get(f))) for p in edited}
    pick = min(edited, key=lambda p: (-done[p], p.stem != name, str(p)))
    counts = ", ".join(f"{p.name}: {done[p]} of {len(fns)}" for p in edited)
    return pick, (f"several were edited; graded functions changed from the stub: {counts}; graded the one with the "
                  f"most, then the one named like the exercise, then the first by name")


def match_notebooks(paths: list[Path], names: list[str], released: dict[str, Path] | None = None,
                    functions: dict[str, list[str]] | None = None) -> tuple[dict[str, Path], list[str]]:
    """Which submitted notebook is which exercise (by the metadata `labkit exercises build` wrote, else by
    name). Several for one exercise: see _pick (`functions`: each exercise's graded functions)."""
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
        pick, why = _pick(name, sorted(found), released, functions)
        matched[name] = pick
        others = ", ".join(p.name for p in sorted(found) if p != pick)
        notes.append(f"{len(found)} notebooks for {name} ({', '.join(p.name for p in sorted(found))}): graded "
                     f"{pick.name} ({why}); not graded: {others}")
    return matched, notes


def extract_code(path: Path) -> tuple[list[list], list[str]]:
    """[code cell number, source] of each code cell; shell/magic lines become `pass` (with a note)."""
    nb, dropped = _read(path)
    cells, number = [], 0
    notes = [f"its cell outputs ({dropped / 2**20:.0f} MB) were dropped before grading: the grader runs the code "
             f"only (clear large outputs before submitting)"] if dropped > 2**20 else []
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
