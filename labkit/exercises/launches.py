"""Which Triton kernels a call launched, so an exercise can require the student's own kernel to run on x.

`install()` (also `bind()`, an exercise's `prepare` hook) wraps the launch entry points of compiled
(JITFunction) and interpreted (InterpretedFunction) kernels once, before student code runs. Inside
`record()` each launch is listed with its name, the file its kernel was defined in and the tensors it got:
`touched(x, launched)` says whether one of them was x (or a copy of x); `own(launched)` keeps the kernels
defined outside labkit, torch and triton (the notebook's); `produced(out, launched)` whether the value returned
is what one of the notebook's kernels left in its memory (not a launch on a scratch buffer, then the library's
result). Import triton only after labkit.setup().
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Iterator

import torch

from labkit import compat

LABKIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Launch:
    name: str
    where: str  # the file the kernel was defined in
    tensors: list[torch.Tensor] = field(default_factory=list)
    after: list[torch.Tensor] = field(default_factory=list)  # a notebook kernel's tensors' storage right after it ran


_active: list[list[Launch]] = []
_installed = False


def _where(kernel: object) -> str:
    code = getattr(getattr(kernel, "fn", kernel), "__code__", None)
    return code.co_filename if code is not None else "?"


def install() -> bool:
    """Wrap Triton's launch methods once (idempotent); False when Triton is not installed."""
    global _installed
    if _installed:
        return True
    classes = compat.launch_classes()
    if not classes:
        return False
    for cls in classes:
        original = cls.run

        def run(self, *args, _original=original, **kwargs):
            if not _active or kwargs.get("warmup", False):
                return _original(self, *args, **kwargs)
            tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
            launch = Launch(getattr(getattr(self, "fn", self), "__name__", "?"), _where(self), tensors)
            _active[-1].append(launch)
            result = _original(self, *args, **kwargs)
            if _is_own(launch.where):  # what it wrote, before anything else can change it
                if any(t.is_cuda for t in tensors):
                    torch.cuda.synchronize()
                launch.after = [_storage_copy(t) for t in tensors]
            return result

        run.labkit_recording = _recording  # labkit's own launcher goes around the wrapper while nothing records
        cls.run = run
    _installed = True
    return True


def _recording() -> bool:
    """Whether a record() block is open (the wrapper passes every launch straight on otherwise)."""
    return bool(_active)


def bind(device: str | None = None) -> None:
    """An exercise's `prepare` hook: install the wrapper before student code runs (`device` unused)."""
    install()


@contextlib.contextmanager
def record() -> Iterator[list[Launch]]:
    """The Triton launches made inside the block (filled in as they happen)."""
    install()
    launched: list[Launch] = []
    _active.append(launched)
    try:
        yield launched
    finally:
        _active.remove(launched)


def touched(x: torch.Tensor, launched: list[Launch]) -> bool:
    """Whether a launched kernel got x's memory, or a tensor holding x's values (a copy of x)."""
    ptr = x.untyped_storage().data_ptr()
    for t in (t for launch in launched for t in launch.tensors):
        if x.numel() and t.untyped_storage().data_ptr() == ptr:
            return True
        if t.numel() == x.numel() and t.dtype == x.dtype and t.device == x.device:
            try:
                if torch.equal(t.reshape(x.shape), x):
                    return True
            except RuntimeError:
                continue
    return False


def _is_own(where: str) -> bool:
    skip = (LABKIT_DIR + os.sep, os.path.dirname(torch.__file__) + os.sep, os.sep + "triton" + os.sep,
            "torchinductor")
    return not any(s in where for s in skip)


def own(launched: list[Launch]) -> list[str]:
    """The launched kernels defined in the student's code: not in labkit, torch, triton or generated code."""
    return [launch.name for launch in launched if _is_own(launch.where)]


def _storage_copy(t: torch.Tensor) -> torch.Tensor:
    """t's whole storage as it is now, as t's dtype (a copy)."""
    s = t.untyped_storage()
    n = s.nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(s, 0, (n,), (1,)).clone()


def produced(out: object, launched: list[Launch]) -> bool:
    """Whether `out` (a tensor) lives in memory a notebook kernel wrote, and holds what that kernel left there:
    the last such launch's copy of its storage, seen as `out`, equals `out` (NaN where `out` has NaN)."""
    if not isinstance(out, torch.Tensor) or out.numel() == 0:
        return False
    ptr = out.untyped_storage().data_ptr()
    for launch in reversed([la for la in launched if _is_own(la.where)]):
        for t, after in zip(launch.tensors, launch.after):
            if t.untyped_storage().data_ptr() != ptr or after.dtype != out.dtype:
                continue
            try:
                then = after.as_strided(out.shape, out.stride(), out.storage_offset())
            except RuntimeError:
                continue
            same = (then == out) | (then.isnan() & out.isnan()) if out.is_floating_point() else then == out
            return bool(same.all())
    return False
