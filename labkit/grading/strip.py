"""The labkit the grading sandbox sees: a copy with the bodies of the answers removed (source and bytecode).

labkit holds the answers of some exercises (spec.Function.answers: the 1F1B order, the batching policy,
the attention kernel, the capstone's Trainer). The child stubs them (labkit.grading.answers), but a stub
keeps the real object reachable (a module reload, the source file). So the parent writes a copy of the
package in which each answer's body (each method's, for a class) is a `raise`, as are the module's private
helpers that only answers used, with no bytecode, and the sandbox mounts it where labkit is.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import shutil
from pathlib import Path

from labkit.paths import COURSE_ROOT


def _where(dotted: str) -> tuple[Path, str]:
    """(source file, top-level name) where the object a dotted name refers to is defined."""
    module, _, attr = dotted.rpartition(".")
    obj = getattr(importlib.import_module(module), attr)
    obj = getattr(obj, "fn", obj)  # a Triton kernel: its Python function
    return Path(inspect.getsourcefile(obj)).resolve(), obj.__name__


def _raise(message: str) -> list[ast.stmt]:
    return ast.parse(f"raise RuntimeError({message!r})").body  # its docstring goes too: it may describe the idea


def _strip_def(node: ast.AST, message: str) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node.body = _raise(message)
    elif isinstance(node, ast.ClassDef):
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                item.body = _raise(message)


def _names_used(nodes: list[ast.AST]) -> set[str]:
    return {n.id for tree in nodes for n in ast.walk(tree) if isinstance(n, ast.Name)}


def strip_source(source: str, names: dict[str, str]) -> str:
    """`source` with the top-level functions/classes in `names` (name -> why) reduced to a raise, then any
    private top-level function no longer used by the rest of the module, until none is left."""
    tree = ast.parse(source)
    tops = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    missing = set(names) - set(tops)
    if missing:
        raise ValueError(f"answers {sorted(missing)} are not defined at the top level of their module")
    stripped: set[str] = set()
    todo = dict(names)
    while todo:
        for name, why in todo.items():
            _strip_def(tops[name], why)
            stripped.add(name)
        why = next(iter(names.values()))
        used = _names_used([n for n in tree.body if getattr(n, "name", None) not in stripped] +
                           [tops[n] for n in stripped])  # a stripped def still names its decorators, defaults
        todo = {name: why for name, node in tops.items() if name.startswith("_") and not name.startswith("__")
                and name not in stripped and name not in used and isinstance(node, (ast.FunctionDef,
                                                                                    ast.AsyncFunctionDef))}
    return ast.unparse(tree) + "\n"


def stripped_copy(answers: dict[str, str], dest: Path) -> Path:
    """Copy labkit/ into dest/labkit (no __pycache__) with the `answers` (dotted name -> the exercise it
    answers) stripped; returns the copy's package folder."""
    package = (COURSE_ROOT / "labkit").resolve()
    copy = dest / "labkit"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"), symlinks=False)
    by_file: dict[Path, dict[str, str]] = {}
    for dotted, exercise in sorted(answers.items()):
        path, name = _where(dotted)
        if not path.is_relative_to(package):
            raise ValueError(f"{dotted} is defined outside labkit ({path}): it cannot be stripped")
        by_file.setdefault(path, {})[name] = (f"{dotted} is what exercise {exercise} asks you to write: the grader's "
                                              f"copy of labkit does not have it; write your own")
    for path, names in by_file.items():
        target = copy / path.relative_to(package)
        target.write_text(strip_source(path.read_text(encoding="utf-8"), names), encoding="utf-8")
    return copy
