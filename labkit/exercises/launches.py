"""Which Triton kernels ran: a hook on Triton's launch path, so a check can tell a kernel was launched on x.

`record()` collects, while it is open, the tensors each Triton launch received (the compiled
JITFunction.run on a GPU, InterpretedFunction.run on the CPU interpreter); `touched(x, seen)` says
whether one of them is x's memory or holds x's values (a copy such as x.contiguous()).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

_active: list[list[torch.Tensor]] = []
_installed = False


def install() -> bool:
    """Wrap Triton's launch methods once (idempotent); False when Triton is not installed."""
    global _installed
    if _installed:
        return True
    try:
        from triton.runtime import jit
    except ImportError:
        return False
    classes = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    except ImportError:
        pass
    for cls in classes:
        original = cls.run

        def run(self, *args, _original=original, **kwargs):
            if _active and not kwargs.get("warmup"):
                _active[-1].extend(a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor))
            return _original(self, *args, **kwargs)

        cls.run = run
    _installed = True
    return True


@contextlib.contextmanager
def record() -> Iterator[list[torch.Tensor]]:
    """The tensors handed to Triton kernels launched inside the block (after it ends)."""
    install()
    seen: list[torch.Tensor] = []
    _active.append(seen)
    try:
        yield seen
    finally:
        _active.remove(seen)


def touched(x: torch.Tensor, seen: list[torch.Tensor]) -> bool:
    """Whether a launched kernel got x's memory, or a tensor holding x's values (a copy of x)."""
    ptr = x.untyped_storage().data_ptr()
    for t in seen:
        if x.numel() and t.untyped_storage().data_ptr() == ptr:
            return True
        if t.numel() == x.numel() and t.dtype == x.dtype and t.device == x.device:
            try:
                if torch.equal(t.reshape(x.shape), x):
                    return True
            except RuntimeError:
                continue
    return False
