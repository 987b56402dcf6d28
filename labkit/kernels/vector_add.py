"""z = x + y, elementwise: the first Triton kernel.

Bytes: read x and y, write z: 3 * n * element_size (12n for fp32, 6n for fp16/bf16).
FLOPs: n additions. A memory-bound kernel: its speed is the speed of moving those bytes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkit import compat
from labkit.kernels._common import (FLOAT_DTYPES, INTERPRETED, Launcher, builds_graph, cdiv, check_same_device,
                                    check_same_dtype, check_tensor)


def min_bytes(n: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes the addition must move: two reads and one write of n elements."""
    return 3 * n * torch.empty((), dtype=dtype).element_size()


def flops(n: int) -> int:
    return n


def reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


@triton.jit
def vector_add_kernel(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    # The grid has cdiv(n, BLOCK) programs; this one is number `pid` and handles one block.
    pid = tl.program_id(axis=0)
    # The BLOCK indices this program owns: pid*BLOCK, pid*BLOCK + 1, ..., pid*BLOCK + BLOCK-1.
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    # The last block runs past the end of the arrays when n is not a multiple of BLOCK:
    # the mask switches those lanes off, so they neither read nor write memory.
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    # Add in fp32 and round once to the output dtype (for fp16/bf16 that is what the GPU does too).
    z = x.to(tl.float32) + y.to(tl.float32)
    tl.store(z_ptr + offsets, z.to(z_ptr.dtype.element_ty), mask=mask)


BLOCK, NUM_WARPS = 1024, 4  # swept on an H200 (1M and 16M elements, fp32 and bf16, both timing modes)
# (dtype, device) pairs that passed the checks once: later calls with them skip the checks.
_checked: set = set()


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y for two tensors of the same shape and dtype (fp32, fp16 or bf16).

    Non-contiguous inputs are first made contiguous (a copy), so the kernel sees flat arrays.
    Differentiable: when x or y requires grad, the result carries a backward (dx = dy = dz).
    """
    if builds_graph(x, y):
        return _vector_add_apply(x, y)
    return _vector_add(x, y)


class _VectorAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return _vector_add(x, y)

    @staticmethod
    def backward(ctx, dz):
        return dz, dz


_vector_add_apply = compat.autograd_apply(_VectorAdd)  # _VectorAdd.apply without the Python wrapper's per-call checks


def _vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # The hot path: at 1M elements the kernel runs for microseconds, so the Python around it must be
    # short: inputs of a kind that passed the checks before go straight to the launch, and the launch
    # skips Triton's per-call argument binding (Launcher, labkit/kernels/_launch.py).
    if not ((x.dtype, y.dtype, x.device, y.device) in _checked and x.shape == y.shape and x.is_contiguous()
            and y.is_contiguous() and 0 < x.numel() < 2**31):
        x, y = _checked_inputs(x, y)
        if x.numel() == 0:
            return torch.empty_like(x)
    n = x.numel()
    z = torch.empty_like(x)
    # BLOCK elements per program and NUM_WARPS warps (1024 and 4: 128 threads, each adding 8 pairs,
    # loaded in 16-byte pieces for fp32); cdiv(n, BLOCK) programs cover the whole array.
    _launch.launch((cdiv(n, BLOCK),), (x, y, z, n), _META)
    return z


_launch = Launcher(vector_add_kernel)
_META = dict(BLOCK=BLOCK, num_warps=1 if INTERPRETED else NUM_WARPS)


def _checked_inputs(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x and y, contiguous, after the checks (raising a clear error); their kind skips the checks next time."""
    check_tensor("vector_add", "x", x, FLOAT_DTYPES)
    check_tensor("vector_add", "y", y, FLOAT_DTYPES)
    check_same_device("vector_add", x=x, y=y)
    check_same_dtype("vector_add", x=x, y=y)
    if x.shape != y.shape:
        raise ValueError(f"vector_add: x and y must have the same shape: expected y of shape "
                         f"{tuple(x.shape)}, got {tuple(y.shape)} (broadcast it first with y.expand_as(x)).")
    if x.numel() >= 2**31:
        raise ValueError(f"vector_add: {x.numel()} elements is too many for 32-bit offsets; split the tensor.")
    _checked.add((x.dtype, y.dtype, x.device, y.device))
    return x.contiguous(), y.contiguous()


# ---- labkit bench: the cases `labkit bench` times (see labkit/kernels/_bench.py)
from labkit.kernels._bench import BenchCase, Timed, bind, maybe_compile, randn  # noqa: E402


def _bench(dims: tuple[int, ...], dtype: torch.dtype, use_compile: bool) -> Timed:
    n = torch.Size(dims).numel()
    x, y = randn(n, dtype=dtype), randn(n, dtype=dtype)
    return Timed(str(n), lambda: vector_add(x, y),
                 {"eager": lambda: reference(x, y), "compile": bind(maybe_compile(reference, use_compile), x, y)},
                 min_bytes(n, dtype))


def bench_cases() -> list[BenchCase]:
    return [BenchCase("vector_add", _bench, gpu_sizes=("1048576", "16777216", "134217728"), cpu_sizes=("4097",))]
