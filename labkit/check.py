"""The checks students call: `check.NAME(fn)` runs NAME's visible cases and prints what is wrong.

A facade over labkit.exercises (one module per exercise). A check never raises, so a check cell
runs (under nbval too) before the student has written anything.
"""
from __future__ import annotations

from typing import Any, Callable

from labkit import exercises as _exercises
from labkit.exercises.ex06_cuda_kernel import SCALE_WRAPPER, build_scale_extension, have_cuda_toolchain
from labkit.exercises.feedback import describe_error
from labkit.exercises.observe import compare, expect_tensor, snapshot

__all__ = ["run_check", "describe_error", "compare", "expect_tensor", "snapshot", "SCALE_WRAPPER",
           "build_scale_extension", "have_cuda_toolchain", *_exercises.functions()]


def run_check(name: str, fn: Any, cases: list[dict] | None = None) -> bool:
    """Run `fn` on the visible cases of exercise function `name` (or on `cases`); print one verdict."""
    from labkit.exercises.feedback import run_check as run

    return run(_exercises.function(name), fn, cases)


def __getattr__(name: str) -> Callable[[Any], bool]:
    """check.NAME: the check of the graded function NAME."""
    fns = _exercises.functions()
    if name not in fns:
        raise AttributeError(f"labkit.check has no check {name!r}; the checks are: {', '.join(fns)}")

    def check(fn: Any) -> bool:
        return run_check(name, fn)

    check.__name__ = name
    check.__doc__ = f"Check your `{name}` on a few visible cases; prints what is wrong, returns True if all pass."
    return check


def __dir__() -> list[str]:
    return sorted(__all__)
