"""Which Triton kernels a call launched, so an exercise can require the student's own kernel to run.

`record()` wraps the launch entry points of compiled (JITFunction) and interpreted (InterpretedFunction)
kernels while a call runs and lists the kernels it launched; `own(names)` keeps those defined outside
labkit, torch and triton (the notebook's). Import triton only after labkit.setup() (the interpreter).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import torch

LABKIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_classes: list[type] = []
_originals: dict[type, object] = {}


def bind(device: str | None = None) -> None:
    """Find the kernel classes and keep their launch methods (call it before student code; `device` unused)."""
    if _classes:
        return
    from triton.runtime.jit import JITFunction

    _classes.append(JITFunction)
    try:
        from triton.runtime.interpreter import InterpretedFunction
        _classes.append(InterpretedFunction)
    except ImportError:  # a Triton without the interpreter
        pass
    for cls in _classes:
        _originals[cls] = cls.run


def _where(kernel: object) -> str:
    fn = getattr(kernel, "fn", kernel)
    code = getattr(fn, "__code__", None)
    return code.co_filename if code is not None else "?"


@contextmanager
def record() -> Iterator[list[tuple[str, str]]]:
    """Within the block, each kernel launch appends (kernel name, file it was defined in) to the list."""
    bind()
    launched: list[tuple[str, str]] = []

    def wrap(original):
        def run(self, *args, **kwargs):
            if not kwargs.get("warmup", False):
                launched.append((getattr(getattr(self, "fn", self), "__name__", "?"), _where(self)))
            return original(self, *args, **kwargs)
        return run

    for cls in _classes:
        cls.run = wrap(_originals[cls])
    try:
        yield launched
    finally:
        for cls in _classes:
            cls.run = _originals[cls]


def own(launched: list[tuple[str, str]]) -> list[str]:
    """The launched kernels defined in the student's code: not in labkit, torch, triton or generated code."""
    skip = (LABKIT_DIR + os.sep, os.path.dirname(torch.__file__) + os.sep, os.sep + "triton" + os.sep,
            "torchinductor")
    return [name for name, where in launched if not any(s in where for s in skip)]
