"""The claim names a notebook makes, read from its source without running it (tests/test_reference.py and
`labkit reference pending` compare them with each committed reference run's claims).

A claim's name is the first argument of `labkit.claim(...)` or `labkit.skip_claim(...)`: a string, an f-string
(its `{...}` parts match any name part, e.g. `tc_triton_vs_cublas_{s}`), `a if cond else b` (either), or a loop
variable bound by a `for` over literal names (`for name in ("a", "b"):`, `for name, says in (("a", "..."), ...)`).
A name read any other way is refused with what to write instead.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

CALLS = ("claim", "skip_claim")


@dataclass(frozen=True)
class ClaimName:
    """One name a claim call can record: `text` as written (f-string parts as `{...}`) and its pattern."""
    text: str
    pattern: str  # a regular expression matched against a whole recorded name

    def matches(self, name: str) -> bool:
        return re.fullmatch(self.pattern, name) is not None


class UnreadableClaimName(ValueError):
    """A claim's name is computed in a way this reader cannot follow without running the notebook."""


def code_cells(path: Path) -> list[str]:
    """The source of each code cell of a notebook file (.ipynb)."""
    cells = json.loads(Path(path).read_text())["cells"]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c.get("cell_type") == "code"]


def in_notebook(path: Path, calls: tuple[str, ...] = CALLS) -> list[ClaimName]:
    """Every claim name a notebook can record, in order, each once (calls=("diagnosis",): its diagnoses' names)."""
    found: dict[str, ClaimName] = {}
    for i, src in enumerate(code_cells(path)):
        try:
            tree = ast.parse(_without_magics(src))
        except SyntaxError as exc:
            if any(f"{c}(" in src for c in calls):
                raise UnreadableClaimName(f"{Path(path).name}, code cell {i + 1}: not Python ({exc})") from None
            continue
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if _is_call_of(node, calls) and node.args:
                for name in _names(node.args[0], node, parents, f"{Path(path).name}, code cell {i + 1}"):
                    found.setdefault(name.text, name)
    return list(found.values())


def _without_magics(src: str) -> str:
    """A cell's source with IPython's `%magic` and `!shell` lines made into `pass` (same indentation)."""
    lines = [ln[:len(ln) - len(ln.lstrip())] + "pass" if ln.lstrip()[:1] in ("%", "!") else ln
             for ln in src.splitlines()]
    return "\n".join(lines)


def _is_call_of(node: ast.AST, calls: tuple[str, ...]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr in calls) or (isinstance(f, ast.Name) and f.id in calls)


def _literal(text: str) -> ClaimName:
    return ClaimName(text, re.escape(text))


def _names(expr: ast.AST, at: ast.AST, parents: dict, where: str) -> list[ClaimName]:
    """The names an expression can take, where it is the name argument of a claim call at node `at`."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return [_literal(expr.value)]
    if isinstance(expr, ast.JoinedStr):
        text, pattern = "", ""
        for part in expr.values:
            if isinstance(part, ast.Constant):
                text, pattern = text + str(part.value), pattern + re.escape(str(part.value))
            else:
                text, pattern = text + "{" + ast.unparse(part.value) + "}", pattern + r"[\w.\-]*"
        return [ClaimName(text, pattern)]
    if isinstance(expr, ast.IfExp):
        return _names(expr.body, at, parents, where) + _names(expr.orelse, at, parents, where)
    if isinstance(expr, ast.Name):
        values = _loop_values(expr.id, at, parents)
        if values is not None:
            return [n for v in values for n in _names(v, at, parents, where)]
    if isinstance(expr, (ast.List, ast.Tuple)):  # a loop over a literal list of names
        return [n for e in expr.elts for n in _names(e, at, parents, where)]
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add) and not isinstance(expr.left, ast.Constant):
        return _names(expr.left, at, parents, where) + _names(expr.right, at, parents, where)
    raise UnreadableClaimName(f"{where}: the claim name {ast.unparse(expr)!r} cannot be read without running the "
                              "notebook; write it as a string, an f-string, or a loop variable over literal names "
                              "(for name in ('a', 'b'): ...)")


def _loop_values(var: str, at: ast.AST, parents: dict) -> list[ast.AST] | None:
    """The expressions a `for` loop enclosing `at` binds `var` to, when it loops over a literal."""
    node = at
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.For, ast.comprehension)):
            slot = _slot(node.target, var)
            if slot is None:
                continue
            items = node.iter
            if not isinstance(items, (ast.Tuple, ast.List, ast.BinOp, ast.IfExp)):
                return None
            return [_pick(item, slot) for item in _items(items)]
    return None


def _items(expr: ast.AST) -> list[ast.AST]:
    """The elements of a literal tuple/list, of `a + b` of them, or of either branch of `a if c else b`."""
    if isinstance(expr, (ast.Tuple, ast.List)):
        return list(expr.elts)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _items(expr.left) + _items(expr.right)
    if isinstance(expr, ast.IfExp):
        return _items(expr.body) + _items(expr.orelse)
    return [expr]  # not a literal: _names refuses it


def _slot(target: ast.AST, var: str) -> tuple[int, ...] | None:
    """Where `var` sits in a loop target: () for the whole element, (1,) for the second of a pair..."""
    if isinstance(target, ast.Name):
        return () if target.id == var else None
    if isinstance(target, (ast.Tuple, ast.List)):
        for i, t in enumerate(target.elts):
            inner = _slot(t, var)
            if inner is not None:
                return (i, *inner)
    return None


def _pick(item: ast.AST, slot: tuple[int, ...]) -> ast.AST:
    for i in slot:
        if not isinstance(item, (ast.Tuple, ast.List)) or i >= len(item.elts):
            return item  # not a literal tuple: _names refuses it
        item = item.elts[i]
    return item
