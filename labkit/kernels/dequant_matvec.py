"""y = (x @ q.T) * scale + bias for a few rows of x: the product of a decode step with one-byte weights.

q holds int8 or fp8 (e4m3) weights, (N, K) row-major, one float scale per output row (labkit.inference.quant).
With M rows of x (a decode step: M sequences of one token each, M <= MAX_ROWS) the product does 2MNK FLOPs over
NK weight bytes: about 2M FLOP/byte, memory-bound, so its time is the weights' bytes at copy bandwidth.
Bytes: read q (N * K), x (M * K), scale and bias (N each); write y (M * N).

One row (decode of one sequence): each program owns BLOCK_N output rows and reads their weights once, BLOCK_K at
a time, converting them to fp32 in registers; it multiplies and adds elementwise in the loop, which Triton
pipelines (the next weights load while these are added), and sums across the row once at the end. Two to
MAX_ROWS rows: x padded to 16 rows and tl.dot, the weights converted to x's dtype in registers. No converted
copy of the weights is ever written. Many small programs keep every SM loading even for a 2048 x 2048 product.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from labkit.kernels._common import (FLOAT_DTYPES, INTERPRETED, Launcher, PlanCache, cdiv, check_same_device,
                                    check_tensor, next_pow2, num_sms)

MAX_ROWS = 8  # rows of x one call takes (more rows: a matmul of converted weights is the faster product)
WEIGHT_DTYPES = (torch.int8, torch.float8_e4m3fn)
X_DTYPES = FLOAT_DTYPES  # x, scale and bias


def min_bytes(M: int, N: int, K: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes the product must move at least: one-byte weights, x, scale and bias read; y written."""
    return N * K + (M * K + 2 * N + M * N) * dtype.itemsize


def flops(M: int, N: int, K: int) -> int:
    return 2 * M * N * K


def reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
              ) -> torch.Tensor:
    """The same product in float64 (weights converted exactly), rounded once to x's dtype."""
    y = x.double() @ q.double().T * scale.double()
    return (y if bias is None else y + bias.double()).to(x.dtype)


@triton.jit
def dequant_matvec_kernel(x_ptr, q_ptr, scale_ptr, bias_ptr, y_ptr, M, N, K, stride_xm, stride_qn, stride_ym,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, DOT: tl.constexpr,
                          IEEE: tl.constexpr, HAS_BIAS: tl.constexpr):
    # Program p: outputs n = p * BLOCK_N ... of every row m < M (M == 1 unless DOT); y[m, n] = sum_k x[m, k] q[n, k].
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < N
    q_rows = q_ptr + rows.to(tl.int64)[:, None] * stride_qn
    m = tl.arange(0, 16)
    m_mask = m < M
    if DOT:
        acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    else:
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        w = tl.load(q_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if DOT:  # x's rows padded to 16 (zeros), the weights converted to x's dtype (exact for int8 and e4m3)
            xv = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                         other=0.0)
            if IEEE:  # fp32 products exact to fp32 (not TF32)
                acc = tl.dot(xv.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(xv, tl.trans(w.to(xv.dtype)), acc)
        else:  # one row: multiply and add elementwise, no reduction inside the loop
            xv = tl.load(x_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
            acc2 += w.to(tl.float32) * xv[None, :]
    if DOT:
        y = acc
    else:
        y = tl.sum(acc2, axis=1)[None, :]
    y = y * tl.load(scale_ptr + rows, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if DOT:
        tl.store(y_ptr + m[:, None] * stride_ym + rows[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=m_mask[:, None] & n_mask[None, :])
    else:
        tl.store(y_ptr + rows[None, :], y.to(y_ptr.dtype.element_ty), mask=n_mask[None, :])


class RowPlan(NamedTuple):
    """Tiles of one path: BLOCK_N (the largest in `block_n` that still gives `programs_per_sm` programs per SM,
    else the smallest), BLOCK_K, warps and pipeline stages."""
    block_n: tuple[int, ...]
    programs_per_sm: float
    block_k: int
    warps: int
    stages: int


# Swept on an H200 (2026-11-27; 2048 x 2048 to 32000 x 2048 and 2048 x 8192, bf16 x, int8 weights, weights
# distinct per call so none stay in L2): one row took 4.0 us at 2048 x 2048 (cuBLAS bf16 6.4 us) and 22.4 us at
# 32000 x 2048 (bf16 34.8 us); tl.dot for one row was slower wherever N was small (2048 x 8192: 14.6 us vs 8.1).
ONE_ROW = RowPlan(block_n=(4, 2, 1), programs_per_sm=2, block_k=512, warps=2, stages=3)
ONE_ROW_WIDE_K = 8192  # rows of K this long or longer take BLOCK_K 1024
FEW_ROWS = RowPlan(block_n=(64, 32, 16), programs_per_sm=1.5, block_k=256, warps=4, stages=4)
_PLANS = PlanCache()
_kernel = Launcher(dequant_matvec_kernel)


def _plan(M: int, N: int, K: int, dtype: torch.dtype, device: torch.device, has_bias: bool) -> tuple[tuple, dict]:
    """(grid, constexprs and num_warps) for M rows of x in `dtype`, N outputs, K inputs, cached."""
    key = (M, N, K, dtype, device, has_bias)
    found = _PLANS.get(key)
    if found is None:
        plan = ONE_ROW if M == 1 else FEW_ROWS
        enough = plan.programs_per_sm * num_sms(device)
        block_n = next((b for b in plan.block_n if cdiv(N, b) >= enough), plan.block_n[-1])
        block_k = plan.block_k * (2 if M == 1 and K >= ONE_ROW_WIDE_K else 1)
        if M > 1 and block_n == 64:
            block_k //= 2  # (64 x 256 one-byte weights and their bf16 copy: past the registers)
        block_k = min(block_k, max(16, next_pow2(K)))
        found = _PLANS.put(key, ((cdiv(N, block_n),), dict(
            BLOCK_N=block_n, BLOCK_K=block_k, STAGES=plan.stages, DOT=M > 1,
            IEEE=dtype == torch.float32 or INTERPRETED,  # (the interpreter's 16-bit dot misreads converted weights)
            HAS_BIAS=has_bias, num_warps=1 if INTERPRETED else plan.warps)))
    return found


def dequant_matvec(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """(x @ q.T) * scale + bias for x of shape (..., K) with at most MAX_ROWS rows, q int8 or fp8 e4m3 of shape
    (N, K), scale and bias of shape (N,): y of shape (..., N) in x's dtype, summed in fp32 and rounded once."""
    check_tensor("dequant_matvec", "x", x, X_DTYPES)
    check_tensor("dequant_matvec", "q", q, WEIGHT_DTYPES)
    check_tensor("dequant_matvec", "scale", scale, X_DTYPES)
    named = dict(x=x, q=q, scale=scale)
    if bias is not None:
        named["bias"] = check_tensor("dequant_matvec", "bias", bias, X_DTYPES)
    check_same_device("dequant_matvec", **named)
    if x.dim() == 0 or q.dim() != 2 or q.shape[1] != x.shape[-1]:
        raise ValueError(f"dequant_matvec: q must be (N, K) with K = x.shape[-1]; got x {tuple(x.shape)}, "
                         f"q {tuple(q.shape)}.")
    N, K = q.shape
    for name, t in (("scale", scale), ("bias", bias)):
        if t is not None and (t.dim() != 1 or t.shape[0] != N):
            raise ValueError(f"dequant_matvec: {name} must have shape ({N},), one value per row of q; got "
                             f"{tuple(t.shape)}.")
    M = math.prod(x.shape[:-1])
    x2 = x.reshape(M, K)
    if M > MAX_ROWS:
        raise ValueError(f"dequant_matvec: x has {M} rows, more than {MAX_ROWS}; for more rows convert the "
                         f"weights and use a matmul: (x @ q.to(x.dtype).T) * scale.")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if q.stride(-1) != 1:
        q = q.contiguous()
    scale = scale.contiguous()
    bias = None if bias is None else bias.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M and N:
        if K == 0:
            y.copy_((scale * 0 if bias is None else bias).expand(M, N))
        else:
            grid, meta = _plan(M, N, K, x.dtype, x.device, bias is not None)
            _kernel.launch(grid, (x2, q, scale, scale if bias is None else bias, y, M, N, K, x2.stride(0),
                                  q.stride(0), N), meta)
    return y.view(*x.shape[:-1], N)
