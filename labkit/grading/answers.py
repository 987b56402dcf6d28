"""Answers that live in labkit: while the function they answer is graded, they are stubs that say so.

An exercise declares them (spec.Function.answers, e.g. "labkit.serving.batcher.launch_delay"). In the grading
child, before student code runs, every labkit module's reference to such an object (a module attribute,
or a value of a module-level dict) is replaced by a stub. While the grader calls the function the name
answers, the stub raises "this is what exercise NN asks you to write"; at any other time (the notebook's
own cells, other exercises) it behaves as the real object, so a notebook that compares with labkit still runs.
This stops `from labkit.serving.batcher import launch_delay`; it cannot hide objects from code that digs through
the process's memory (gc, closures): that is what the sandbox and the hidden cases are for.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any

_grading: list[str] = []  # the function being graded now (at most one)


class AnswerStub:
    """Stands in for one labkit object that is the answer of the functions in `owners`."""

    def __init__(self, name: str, real: Any, owners: dict[str, str]):
        self.__dict__["_name"], self.__dict__["_real"], self.__dict__["_owners"] = name, real, owners

    def _refuse(self) -> RuntimeError:
        fn = _grading[-1]
        return RuntimeError(f"{self._name} is what exercise {self._owners[fn]} asks you to write, so it is not "
                            f"available while your `{fn}` is graded: write your own")

    def _armed(self) -> bool:
        return bool(_grading) and _grading[-1] in self._owners

    def __call__(self, *args, **kwargs):
        if self._armed():
            raise self._refuse()
        return self._real(*args, **kwargs)

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if self._armed():
            raise self._refuse()
        return getattr(self._real, attr)

    def __getitem__(self, key):  # a Triton kernel's launch grid
        if self._armed():
            raise self._refuse()
        return self._real[key]

    def __mro_entries__(self, bases):
        raise TypeError(f"{self._name} is an answer of exercise {', '.join(sorted(set(self._owners.values())))}: "
                        f"the grader does not let you subclass it; write your own class")

    def __repr__(self) -> str:
        return f"<{self._name}: an exercise's answer, a stub while it is graded>"


def _resolve(dotted: str) -> tuple[Any, str]:
    """The object a dotted name refers to (its module imported if need be)."""
    module, _, attr = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr), attr
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"an exercise names {dotted!r} as its answer, but it does not exist: {exc}") from None


def install(answers: dict[str, dict[str, str]]) -> None:
    """answers: dotted name -> {function it answers: its exercise notebook}. Replace every labkit reference."""
    found = {dotted: _resolve(dotted)[0] for dotted in answers}  # every module imported before any stub exists
    for dotted, owners in answers.items():
        real = found[dotted]
        if isinstance(real, AnswerStub):
            real.__dict__["_owners"].update(owners)
            continue
        stub = AnswerStub(dotted, real, dict(owners))
        for modname, mod in list(sys.modules.items()):
            if mod is None or not (modname == "labkit" or modname.startswith("labkit.")):
                continue
            space = getattr(mod, "__dict__", {})
            for key, value in list(space.items()):
                if value is real:
                    space[key] = stub
                elif type(value) is dict:
                    for k, v in list(value.items()):
                        if v is real:
                            value[k] = stub


class grading:
    """`with grading(fn_name):` arms the stubs of the answers to `fn_name`."""

    def __init__(self, fn: str):
        self.fn = fn

    def __enter__(self) -> None:
        _grading.append(self.fn)

    def __exit__(self, *exc) -> None:
        _grading.pop()
