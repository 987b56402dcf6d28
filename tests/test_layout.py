"""labkit's layout: no import cycles, layers that point one way, lab helpers that say which notebooks use them."""
import ast
import functools
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "labkit"
LAB_FOLDERS = ("profiling", "serving", "parallel")  # one folder per notebook's helpers
TOOLING = ("labkit.tools", "labkit.grading")  # course tooling: nothing below it may import it
BELOW_TOOLING = ("labkit.kernels", "labkit.cuda", "labkit.capstone", *(f"labkit.{f}" for f in LAB_FOLDERS))


def module_files() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(ROOT).with_suffix("")
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = p
    return out


MODULES = module_files()


def _owner(name: str) -> str | None:
    """The labkit module a dotted name lives in (labkit.kernels.softmax.min_bytes -> labkit.kernels.softmax)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(name: str) -> set[str]:
    """The labkit modules `name` imports anywhere in its file (in functions too: a deferred import is still one)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found |= {_owner(a.name) for a in node.names if a.name.startswith("labkit")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("labkit"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                found.add(full if full in MODULES else _owner(node.module))
    found.discard(None)
    found.discard(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_no_import_cycle():
    assert cycles(GRAPH) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith(BELOW_TOOLING)])
def test_lab_and_kernel_modules_do_not_import_course_tooling(module):
    assert not {i for i in GRAPH[module] if i.startswith(TOOLING)}


def _docstring(module: str) -> str:
    return ast.get_docstring(ast.parse(MODULES[module].read_text())) or ""


def _used_by(module: str) -> set[str]:
    """The notebook numbers a module's 'Used by:' line names ('notebooks 08 and 10, exercise 10' -> {08, 10})."""
    line = next((ln for ln in _docstring(module).splitlines() if ln.startswith("Used by: ")), "")
    return set(re.findall(r"\b(\d\d)\b", line.split("exercise")[0])) if line else set()


@functools.lru_cache(maxsize=None)
def _notebook_importers() -> dict[str, set[str]]:
    """Each labkit module -> the numbers of the notebooks whose code imports it (or starts it with -m)."""
    users: dict[str, set[str]] = {}
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        code = "\n".join(ln for ln in code.splitlines() if not ln.lstrip().startswith(("%", "!")))
        names = set(re.findall(r'"-m",\s*"(labkit[\w.]+)"', code))
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        for name in names:
            if name in MODULES:
                users.setdefault(name, set()).add(nb.name[:2])
    return users


LAB_MODULES = [m for m in MODULES if m.split(".")[1:2] and m.split(".")[1] in LAB_FOLDERS]


@pytest.mark.parametrize("module", LAB_MODULES)
def test_each_lab_helper_names_the_notebooks_that_use_it(module):
    named = _used_by(module)
    assert named, f"{module}: its docstring needs a line 'Used by: notebook NN' (the notebooks that use it)"
    present = {p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert named <= present, f"{module} names notebooks that do not exist: {sorted(named - present)}"
    missing = _notebook_importers().get(module, set()) - named
    assert not missing, f"{module} is imported by notebook(s) {sorted(missing)}, which its 'Used by:' line omits"


def test_the_used_by_check_reads_the_line():
    assert _used_by("labkit.parallel.pipeline") == {"10"}
    assert "labkit.serving.client" in _notebook_importers()


MAX_LINES = 400
# Modules allowed past MAX_LINES, and why (each must still be past it, and under LONG_CAP: the list cannot go stale).
LONG_MODULES = {
    "labkit.kernels.layer_norm": "one op: the forward, the backward's whole-row and split kernels, the dispatch to "
                                 "its Hopper cluster half (kernels/cluster) and the tables tuned for them",
    "labkit.kernels.matmul": "one op: the tiled kernel, its TMA variant and the dispatch to the Gluon kernel, each "
                             "with the configurations tuned for it",
}
LONG_CAP = 450


@pytest.mark.parametrize("module", list(MODULES))
def test_modules_stay_under_400_lines(module):
    lines = len(MODULES[module].read_text().splitlines())
    if module in LONG_MODULES:
        assert MAX_LINES < lines <= LONG_CAP, f"{module} has {lines} lines: update LONG_MODULES"
    else:
        assert lines <= MAX_LINES, f"{module} has {lines} lines: split it by job (CONTRIBUTING, 'Where things go')"
