"""y = 2 * x, elementwise: the toy kernel of CONTRIBUTING's "add a kernel" recipe.

Bytes: read x, write y: 2 * n * itemsize. FLOPs: n.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkit.kernels._bench import BenchCase, Timed, bind, maybe_compile, randn
from labkit.kernels._common import FLOAT_DTYPES, INTERPRETED, check_tensor


def min_bytes(n: int, dtype: torch.dtype = torch.float32) -> int:
    return 2 * n * dtype.itemsize


def reference(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@triton.jit
def toy_scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)  # math in fp32, one rounding on the way out
    tl.store(y_ptr + offs, (x * 2).to(y_ptr.dtype.element_ty), mask=mask)


def toy_scale(x: torch.Tensor) -> torch.Tensor:
    """2 * x (fp32, fp16 or bf16; non-contiguous inputs are copied first)."""
    check_tensor("toy_scale", "x", x, FLOAT_DTYPES)
    x = x.contiguous()
    y = torch.empty_like(x)
    if x.numel():
        toy_scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024,
                                                          num_warps=1 if INTERPRETED else 4)
    return y


def _bench(dims: tuple[int, ...], dtype: torch.dtype, use_compile: bool) -> Timed:
    n = torch.Size(dims).numel()
    x = randn(n, dtype=dtype)
    return Timed(str(n), lambda: toy_scale(x),
                 {"eager": lambda: reference(x), "compile": bind(maybe_compile(reference, use_compile), x)},
                 min_bytes(n, dtype))


def bench_cases() -> list[BenchCase]:
    return [BenchCase("toy_scale", _bench, gpu_sizes=("16777216",), cpu_sizes=("1000",))]
