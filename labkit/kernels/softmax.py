"""softmax over the last dim: y = exp(x - max(x)) / sum(exp(x - max(x))), row by row.

With x of shape (..., N) holding n elements: bytes: read x once, write y once: 2 * n * element_size.
FLOPs: about 4 per element (subtract, exp, add, divide). Memory-bound: one pass over memory when
a whole row fits in registers; longer rows take a streaming (online) pass plus a writing pass.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from labkit.kernels._common import INTERPRETED, check_tensor, next_pow2, num_sms, row_tile, rows_2d

# Longest row kept whole in registers (one read, one write); longer rows stream through in chunks.
MAX_FUSED_COLS = {torch.float32: 16384, torch.float16: 32768, torch.bfloat16: 32768}
ONLINE_BLOCK = 4096


def min_bytes(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> int:
    return 2 * math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def flops(shape: tuple[int, ...]) -> int:
    return 4 * math.prod(shape)


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


@triton.jit
def softmax_kernel(x_ptr, y_ptr, M, N, stride_x, stride_y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # One tile of BLOCK_M whole rows (BLOCK_N >= N): read once, reduce in registers, write once.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x = tl.where(col_mask[None, :], x, float("-inf"))  # padding columns add exp(-inf) = 0
    m = tl.max(x, axis=1)
    e = tl.exp(x - m[:, None])
    s = tl.sum(e, axis=1)
    y = e * (1.0 / s)[:, None]
    tl.store(y_ptr + rows64 * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_online_kernel(x_ptr, y_ptr, M, N, stride_x, stride_y, BLOCK_N: tl.constexpr):
    # Rows too long for registers. Pass 1 streams the row once, keeping per-lane running maxima
    # m and sums s of exp(x - m), rescaling s by exp(m_old - m_new) whenever m grows.
    # Pass 2 reads the row again and writes exp(x - max) / sum.
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        x_row = x_ptr + tl.cast(row, tl.int64) * stride_x
        y_row = y_ptr + tl.cast(row, tl.int64) * stride_y
        m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK_N,), tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < N, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, x)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # lanes that have seen only padding
            s = s * tl.exp(m - m_safe) + tl.exp(x - m_safe)
            m = m_new
        row_max = tl.max(m, axis=0)
        row_sum = tl.sum(s * tl.exp(tl.where(m == float("-inf"), float("-inf"), m - row_max)), axis=0)
        inv = 1.0 / row_sum
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
            tl.store(y_row + cols, (tl.exp(x - row_max) * inv).to(y_ptr.dtype.element_ty), mask=cols < N)


def softmax(x: torch.Tensor, online: bool | None = None) -> torch.Tensor:
    """Softmax over the last dim of x (fp32, fp16 or bf16; any leading shape), in fp32 math.

    Rows are read through their stride; a copy is made only when the last dim is not contiguous.
    online: None picks the one-pass kernel when a row fits (see MAX_FUSED_COLS), True forces the
    streaming kernel (for teaching and testing), False forces one pass.
    Differentiable: when x requires grad, the backward is dx = y * (dy - sum(dy * y)) (in PyTorch, fp32).
    """
    if torch.is_grad_enabled() and getattr(x, "requires_grad", False):
        return _Softmax.apply(x, online)
    return _softmax(x, online)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, online):
        y = _softmax(x, online)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        y32, dy32 = y.float(), dy.float()
        dx = y32 * (dy32 - (dy32 * y32).sum(dim=-1, keepdim=True))
        return dx.to(y.dtype), None


def _softmax(x: torch.Tensor, online: bool | None = None) -> torch.Tensor:
    check_tensor("softmax", "x", x)
    if x.dim() == 0:
        raise ValueError("softmax: x must have at least one dimension; got a 0-d tensor (use x.reshape(1)).")
    x2 = rows_2d(x)
    M, N = x2.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if x2.numel() == 0:
        return y.view(x.shape)
    if online is None:
        online = N > MAX_FUSED_COLS[x.dtype]
    if not online:
        # Tiles of at least 1024 (fp32) / 2048 (16-bit) elements, 16 values per thread.
        bm, bn, warps = row_tile(N, 1024 if x.dtype == torch.float32 else 2048, 16)
        softmax_kernel[(triton.cdiv(M, bm),)](x2, y, M, N, x2.stride(0), y.stride(0),
                                              BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
    else:
        block = min(ONLINE_BLOCK, next_pow2(N))
        programs = min(M, 16 * num_sms(x.device))
        softmax_online_kernel[(programs,)](x2, y, M, N, x2.stride(0), y.stride(0), BLOCK_N=block,
                                           num_warps=1 if INTERPRETED else 8)
    return y.view(x.shape)


# ---- labkit bench: the cases `labkit bench` times (see labkit/kernels/_bench.py)
from labkit.kernels._bench import BenchCase, Timed, bind, maybe_compile, randn, rows_cols  # noqa: E402


def _bench(dims: tuple[int, ...], dtype: torch.dtype, use_compile: bool) -> Timed:
    M, N = rows_cols(dims)
    x = randn(M, N, dtype=dtype)
    return Timed(f"{M}x{N}", lambda: softmax(x),
                 {"eager": lambda: reference(x), "compile": bind(maybe_compile(reference, use_compile), x)},
                 min_bytes((M, N), dtype))


def bench_cases() -> list[BenchCase]:
    return [BenchCase("softmax", _bench, gpu_sizes=("65536x1024", "16384x4096", "4096x16384", "256x65536"),
                      cpu_sizes=("17x129",))]
