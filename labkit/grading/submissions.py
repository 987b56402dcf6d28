"""Submissions: one folder or one notebook per student; which notebook is which; their code cells."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from labkit import nbio


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "student"


def find_submissions(root: Path) -> list[tuple[str, list[Path]]]:
    """(student, notebooks) for each folder or .ipynb directly inside `root`."""
    found, taken = [], set()
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            nbs = sorted(p for p in entry.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
            name = entry.name
        elif entry.suffix == ".ipynb":
            nbs, name = [entry], entry.stem
        else:
            continue
        student = safe_name(name)
        while student in taken:
            student += "_"
        taken.add(student)
        found.append((student, nbs))
    return found


def match_notebooks(paths: list[Path], names: list[str]) -> tuple[dict[str, Path], list[str]]:
    """Which submitted notebook is which exercise: by the metadata `labkit exercises build` wrote, else by name."""
    matched: dict[str, Path] = {}
    notes = []
    for path in paths:
        try:
            meta = nbio.read(path).get("metadata", {}).get("labkit", {}).get("exercise")
        except Exception:
            meta = None
        stem = path.stem
        name = meta if meta in names else next(
            (n for n in names if n == stem), None) or next((n for n in names if n in stem), None) or next(
            (n for n in names if re.match(r"\d\d", stem) and n[:2] == stem[:2]), None)
        if name is None:
            notes.append(f"{path.name}: not one of the graded notebooks, ignored")
        elif name in matched:
            notes.append(f"{path.name}: a second notebook for {name}, ignored (graded {matched[name].name})")
        else:
            matched[name] = path
    return matched, notes


def extract_code(path: Path) -> tuple[list[list], list[str]]:
    """[code cell number, source] of each code cell; shell/magic lines become `pass` (with a note)."""
    nb = nbio.read(path)
    cells, notes, number = [], [], 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        number += 1
        src = nbio.source(cell)
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
