"""The exercises: one module per exercise notebook, listed in EXERCISES (the registry).

Each module names its NOTEBOOK ("05_triton_row_sum") and its graded FUNCTIONS (spec.Function:
how to call the student's function, its visible cases, the comparison, any extra stage). Its
private twin, solutions/graded/<NOTEBOOK>.py, holds only the hidden cases and the points.
`labkit exercises build|check` (notebooks.py) makes exercises/ from solutions/.
"""
from __future__ import annotations

from types import ModuleType

from labkit.exercises import (ex01_device_placement, ex02_transfers, ex03_timing, ex04_roofline,  # noqa: I001
                              ex05_triton_row_sum, ex06_cuda_kernel, ex07_mixed_precision, ex08_data_parallel)
from labkit.exercises import ex09_attention, ex10_model_parallel, ex11_profiling, ex12_serving  # noqa: I001
from labkit.exercises import ex13_capstone, ex14_llm_inference  # noqa: I001
from labkit.exercises.spec import Function, Stage

EXERCISES: list[ModuleType] = [
    ex01_device_placement,
    ex02_transfers,
    ex03_timing,
    ex04_roofline,
    ex05_triton_row_sum,
    ex06_cuda_kernel,
    ex07_mixed_precision,
    ex08_data_parallel,
    ex09_attention,
    ex10_model_parallel,
    ex11_profiling,
    ex12_serving,
    ex13_capstone,
    ex14_llm_inference,
]

__all__ = ["EXERCISES", "Function", "Stage", "by_notebook", "function", "functions"]


def by_notebook() -> dict[str, list[Function]]:
    """Notebook name -> its graded functions, in registry order."""
    return {mod.NOTEBOOK: list(mod.FUNCTIONS) for mod in EXERCISES}


def functions() -> dict[str, Function]:
    """Function name -> its spec, over every registered exercise."""
    out: dict[str, Function] = {}
    for nb, fns in by_notebook().items():
        for f in fns:
            if f.name in out:
                raise ValueError(f"two exercises grade a function named {f.name!r}: rename one ({nb})")
            out[f.name] = f
    return out


def function(name: str) -> Function:
    """The spec of one graded function, by name."""
    found = functions()
    if name not in found:
        raise KeyError(f"no exercise function {name!r}; registered: {', '.join(found)}")
    return found[name]
