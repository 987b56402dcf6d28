"""What a kernel module offers `labkit bench`: its benchmark cases, each a way to make timed calls.

A kernel module defines `bench_cases() -> list[BenchCase]`; `labkit bench` loops over the modules
in `labkit.kernels.BENCHMARKED` and times what each case's `make(dims, dtype, use_compile)` returns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from labkit import compat


@dataclass
class Timed:
    """One benchmark at one size: the Triton call, its baselines and how much work one call does."""

    shape: str
    triton: Callable[[], object]
    baselines: dict[str, Callable[[], object] | None]
    work: float  # bytes (memory-bound kernels) or FLOPs (unit "TFLOP/s")
    host_only: dict[str, Callable[[], object]] = field(default_factory=dict)  # calls whose host time alone is shown


@dataclass(frozen=True)
class BenchCase:
    """A kernel's benchmark: its name in `labkit bench`, baselines, unit and default sizes and dtypes.

    make(dims, dtype, use_compile) builds inputs of the parsed size on labkit's device and returns a Timed.
    """

    name: str
    make: Callable[[tuple[int, ...], torch.dtype, bool], Timed]
    gpu_sizes: tuple[str, ...]
    cpu_sizes: tuple[str, ...]
    baselines: tuple[str, ...] = ("eager", "compile")
    unit: str = "GB/s"  # or "TFLOP/s": the ceiling is then the matmul rate of the dtype
    gpu_dtypes: tuple[str, ...] = ("fp32", "bf16")
    cpu_dtypes: tuple[str, ...] = ("fp32",)


def rows_cols(dims: tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols) of a size written N (one row) or MxN."""
    return (dims[0], dims[1]) if len(dims) >= 2 else (1, dims[0])


def maybe_compile(fn, use_compile: bool, **options):
    """torch.compile(fn, **options), or None when compile baselines are off."""
    if not use_compile:
        return None
    compat.allow_retained_backward_in_compile()  # the backward rows call autograd.grad(retain_graph=True)
    return torch.compile(fn, **options)


def bind(fn, *args):
    """A call of fn(*args), or None when fn is None."""
    return (lambda: fn(*args)) if fn is not None else None


def grad_fn(fn, inputs, dy):
    """A call of the backward alone: the forward graph is built at the first call (on the stream the
    timing runs on, which a CUDA graph's capture needs) and kept (retain_graph). The inputs become leaves
    of this call's own (same data), so no autograd node is shared with a baseline timed on another stream."""
    if fn is None:
        return None
    inputs = tuple(t.detach().requires_grad_(t.requires_grad) for t in inputs)
    built = []

    def backward():
        if not built:
            built.append(fn(*inputs))
        return torch.autograd.grad(built[0], inputs, dy, retain_graph=True)
    return backward


class _Floor(torch.autograd.Function):
    """An autograd Function that allocates its output and its inputs' gradients and launches nothing."""

    @staticmethod
    def forward(ctx, x, *rest):
        ctx.save_for_backward(x, *rest)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        return tuple(torch.empty_like(t) for t in ctx.saved_tensors)


_floor = compat.autograd_apply(_Floor)  # applied as labkit's kernels apply theirs


def autograd_floor(inputs: tuple[torch.Tensor, ...], dy: torch.Tensor, backward_only: bool = False):
    """The least host time a Python autograd Function on these inputs costs a forward+backward through
    torch.autograd.grad (or the backward alone, as grad_fn times it): it allocates the output and the gradients,
    launches nothing. What is left of a kernel's host time above it is the kernel's own (argument checks, plans,
    allocations, launches); the floor itself is PyTorch's (the Function's node, the autograd engine handing the
    backward to its device thread and back)."""
    if backward_only:
        return grad_fn(_floor, inputs, dy)
    return lambda: torch.autograd.grad(_floor(*inputs), inputs, dy)


def randn(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    """Random inputs on labkit's device."""
    from labkit.device import current
    return torch.randn(*shape, device=current().device, dtype=dtype)


def peer(name: str, source: str = "liger"):
    """A production kernel to compare with (`pip install labkit[peers]`), or None where it is not installed.

    source "liger" (Liger-Kernel's Triton kernels): name "softmax" (x) or "layer_norm" (x, weight, bias).
    source "quack" (quack's CuTe-DSL kernels): "softmax" (x) or "layer_norm" (x, weight, bias; forward only,
    weight and bias converted to fp32 once, as quack asks). None without the package or a GPU.
    """
    from labkit.device import current
    if not current().is_gpu:
        return None
    if name not in ("softmax", "layer_norm") or source not in ("liger", "quack"):
        raise ValueError(f"peer: no production kernel named {name!r} from {source!r}")
    try:
        if source == "quack":
            if name == "softmax":
                from quack.softmax import softmax as quack_softmax
                return quack_softmax
            from quack.rmsnorm import layernorm_fwd
            return _quack_layer_norm(layernorm_fwd)
        if name == "softmax":
            from liger_kernel.ops.softmax import LigerSoftmaxFunction
            return LigerSoftmaxFunction.apply
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        return lambda x, w, b, eps=1e-5: LigerLayerNormFunction.apply(x, w, b, eps)
    except Exception:  # not installed, or its import fails on this GPU/driver (quack needs CUTLASS's DSL)
        return None


def _quack_layer_norm(layernorm_fwd):
    """quack's layer norm forward on (rows, N) views, with fp32 weight and bias converted at the first call."""
    fp32 = {}

    def call(x, w, b, eps=1e-5):
        if w.requires_grad or b.requires_grad:
            raise ValueError("quack's layer norm has no autograd backward")
        if not fp32:
            fp32.update(w=w.float(), b=b.float())
        return layernorm_fwd(x.reshape(-1, x.shape[-1]), fp32["w"], fp32["b"], eps)
    return call


def peer_versions() -> dict[str, str]:
    """Versions of the installed peers (for saved results)."""
    from importlib import metadata
    found = {}
    for package in ("liger-kernel", "quack-kernels"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found
