"""Attention, fused (FlashAttention): o = softmax(q kᵀ · scale [+ causal mask]) v, with backward.

With q, o of shape (B, H, N, d) and k, v of shape (B, H, Nk, d) (here N = Nk):
forward FLOPs: two matmuls per head, q kᵀ and p v: 4·N²·d per head (half of that with a causal
mask, which skips the tiles right of the diagonal). The backward does five (q kᵀ again, p v's two
gradients, ds k and dsᵀ q): 2.5 times the forward.
forward bytes, fused: read q, k, v and write o once, plus the fp32 log-sum-exp of each row kept
for the backward: 4·B·H·N·d·element_size + 4·B·H·N. Naive attention also writes and reads the
N x N score and probability matrices: about 4·B·H·N²·element_size more, which dominates from a
few hundred tokens on. The fused kernel never stores them: each program keeps a tile of queries,
walks over the key/value tiles, and keeps a running max and sum of the softmax (online softmax).
Compute-bound at long N: its intensity is about N/2 FLOP/byte in 16-bit (naive: about d/2).
Its benchmark against SDPA's backends: labkit/kernels/attention_bench.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from labkit import compat
from labkit.kernels._common import INTERPRETED, Launcher, cdiv, check_same_device, check_same_dtype, check_tensor

DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (16, 32, 64, 128)
LOG2E = 1.4426950408889634  # the kernels use exp2: exp(x) = exp2(x · log2 e), folded into the scale
# The interpreter's 16-bit dot is unreliable (bf16 especially): there the operands go to fp32 first,
# which gives the same exact products. On a GPU the dots run on the tensor cores in fp16/bf16.
UPCAST = tl.constexpr(INTERPRETED)


def min_bytes(B: int, H: int, N: int, d: int, dtype: torch.dtype = torch.bfloat16, backward: bool = False,
              n_k: int | None = None) -> int:
    """Bytes the fused forward (or backward) must move at least: q, k, v, o (and do, dq, dk, dv) once, plus the lse."""
    n_k = N if n_k is None else n_k
    qo, kv = B * H * N * d, B * H * n_k * d
    if backward:  # read q, k, v, o, do, lse (and delta); write dq, dk, dv
        return (4 * qo + 4 * kv) * dtype.itemsize + 8 * B * H * N
    return (2 * qo + 2 * kv) * dtype.itemsize + 4 * B * H * N


def naive_bytes(B: int, H: int, N: int, d: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes eager attention (`naive`, no mask) moves: q, k, v read and o written once, plus each op's pass over
    the B·H·N² scores: q @ k.T writes S; * scale reads and writes it; .float() reads it and writes fp32; softmax
    reads and writes fp32; .to(dtype) reads fp32 and writes P; P @ v reads P: 6·s + 16 bytes a score for s-byte
    inputs (28 in bf16); fp32 inputs skip both casts (4·s + 8 = 24)."""
    s = dtype.itemsize
    per_score = 4 * s + 8 if dtype == torch.float32 else 6 * s + 16
    return min_bytes(B, H, N, d, dtype) - 4 * B * H * N + per_score * B * H * N * N


def flops(B: int, H: int, N: int, d: int, causal: bool = False, backward: bool = False,
          n_k: int | None = None) -> float:
    """FLOPs counted the usual way: 4·N·Nk·d per head forward, halved for causal, x2.5 for the backward."""
    n_k = N if n_k is None else n_k
    f = 4.0 * B * H * N * n_k * d * (0.5 if causal else 1.0)
    return 2.5 * f if backward else f


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """scaled_dot_product_attention in `dtype` (float32 or float64: the math backend), returned in that dtype."""
    return F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=causal, scale=scale)


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
          scale: float | None = None) -> torch.Tensor:
    """Attention written out in eager PyTorch: the N x N scores and probabilities go to memory."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        n, n_k = s.shape[-2:]
        keep = torch.ones(n, n_k, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    return p @ v


@triton.jit
def _dot(a, b, acc):
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc)


# ---------------------------------------------------------------------------------------------
# Forward. Program (m, bh): BLOCK_M queries of one (batch, head); it walks over the keys BLOCK_N
# at a time, so only a BLOCK_M x BLOCK_N tile of scores ever exists (in registers).
# ---------------------------------------------------------------------------------------------
@triton.jit
def _fwd_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, lo, hi, N_K, qk_scale,
               D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    # Key/value tiles [lo, hi). MASKED tiles (the diagonal, the ragged end) mask scores to -inf;
    # the others need no mask at all, which is most of them.
    offs_d = tl.arange(0, D)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None]  # kᵀ tile: (D, BLOCK_N)
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :]  # v tile: (BLOCK_N, D)
        if MASKED:
            kt = tl.load(k_ptrs, mask=offs_n[None, :] < N_K, other=0.0)
            v = tl.load(v_ptrs, mask=offs_n[:, None] < N_K, other=0.0)
        else:
            kt = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = _dot(q, kt, None)  # raw scores q·k; the softmax works in log2 units: exp(x·scale) = exp2(x·qk_scale)
        if MASKED:
            keep = offs_n[None, :] < N_K
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, float("-inf"))
        # Online softmax: the new running max; rescale the old sum and output by exp2(m_old - m_new).
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        if MASKED:
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen only masked keys
        p = tl.exp2(s * qk_scale - m_new[:, None])  # one fused multiply-add per score
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = _dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # q, o: (B, H, N, D); k, v: (B, H, N_K, D); lse: (B*H, N) fp32
                    stride_qb, stride_qh, stride_qn,  # element strides (the last dim has stride 1)
                    stride_kb, stride_kh, stride_kn,
                    stride_vb, stride_vh, stride_vn,
                    stride_ob, stride_oh, stride_on,
                    H, N, N_K, qk_scale,  # heads, query and key lengths, scale · log2 e
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    if CAUSAL:  # the longest rows (most key tiles) first, so the short ones fill the tail
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    q_base = q_ptr + b * stride_qb + h * stride_qh
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_base + offs_m[:, None] * stride_qn + offs_d[None, :], mask=offs_m[:, None] < N, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running max (log2 units)
    l_i = tl.zeros((BLOCK_M,), tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros((BLOCK_M, D), tl.float32)  # running sum of exp2(s - m_i) · v
    # Tiles left of the diagonal (causal) or before the ragged end need no mask. With a causal mask,
    # tiles right of the diagonal are never visited: half the work skipped.
    if CAUSAL:
        hi_full = (tl.minimum(start_m, N_K) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(start_m + BLOCK_M, N_K)
    else:
        hi_full = (N_K // BLOCK_N) * BLOCK_N
        hi = N_K
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, 0, hi_full, N_K,
                               qk_scale, D, BLOCK_N, False, CAUSAL)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, offs_m, hi_full, hi, N_K,
                               qk_scale, D, BLOCK_N, True, CAUSAL)
    o = acc / l_i[:, None]
    tl.store(lse_ptr + bh.to(tl.int64) * N + offs_m, m_i + tl.log2(l_i), mask=offs_m < N)  # log2 units
    o_ptrs = o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < N)


# ---------------------------------------------------------------------------------------------
# Backward (FlashAttention-2's split): delta = rowsum(do · o); one kernel makes dk, dv (a program per
# key tile, walking the queries), another dq (a program per query tile, walking the keys). Both
# recompute p = exp2(s - lse) from the saved log-sum-exp instead of storing p in the forward.
# ---------------------------------------------------------------------------------------------
@triton.jit
def attn_bwd_delta_kernel(o_ptr, do_ptr, delta_ptr,  # o, do: (B, H, N, D); delta: (B*H, N) fp32
                          stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
                          H, N, D: tl.constexpr, BLOCK_M: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_d = tl.arange(0, D)
    mask = offs_m[:, None] < N
    o = tl.load(o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :], mask=mask,
                other=0.0).to(tl.float32)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=mask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + bh.to(tl.int64) * N + offs_m, tl.sum(o * do, 1), mask=offs_m < N)


@triton.jit
def attn_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                         # q, do: (B, H, N, D) strided; k, v: (B, H, N_K, D) strided; dk, dv: contiguous
                         # (B, H, N_K, D); lse, delta: (B*H, N) fp32
                         stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                         stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                         H, N, N_K, qk_scale, sm_scale,
                         D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    kv_mask = offs_n[:, None] < N_K
    k = tl.load(k_ptr + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask,
                other=0.0)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask,
                other=0.0)
    q_base = q_ptr + b * stride_qb + h * stride_qh
    do_base = do_ptr + b * stride_dob + h * stride_doh
    row_base = bh.to(tl.int64) * N
    dk = tl.zeros((BLOCK_N, D), tl.float32)
    dv = tl.zeros((BLOCK_N, D), tl.float32)
    lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0  # queries above the diagonal never see these keys
    for start_m in range(lo, N, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_mask = offs_m[:, None] < N
        qt = tl.load(q_base + offs_m[None, :] * stride_qn + offs_d[:, None], mask=offs_m[None, :] < N, other=0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_don + offs_d[None, :], mask=q_mask, other=0.0)
        lse = tl.load(lse_ptr + row_base + offs_m, mask=offs_m < N, other=0.0)
        delta = tl.load(delta_ptr + row_base + offs_m, mask=offs_m < N, other=0.0)
        keep = (offs_m[None, :] < N) & (offs_n[:, None] < N_K)
        if CAUSAL:
            keep = keep & (offs_m[None, :] >= offs_n[:, None])
        pt = tl.where(keep, tl.exp2(_dot(k, qt, None) * qk_scale - lse[None, :]), 0.0)  # pᵀ: (BLOCK_N, BLOCK_M)
        dv = _dot(pt.to(do.dtype), do, dv)
        dpt = _dot(v, tl.trans(do), None)  # (do vᵀ)ᵀ
        dst = pt * (dpt - delta[None, :])  # dsᵀ = pᵀ ∘ (dpᵀ - delta)
        dk = _dot(dst.to(qt.dtype), tl.trans(qt), dk)
    out = (b * H + h) * N_K * D + offs_n[:, None] * D + offs_d[None, :]
    tl.store(dk_ptr + out, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def attn_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,  # as above; dq contiguous like dk
                       stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                       stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                       H, N, N_K, qk_scale, sm_scale,
                       D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q_mask = offs_m[:, None] < N
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :], mask=q_mask,
                other=0.0)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=q_mask, other=0.0)
    lse = tl.load(lse_ptr + bh.to(tl.int64) * N + offs_m, mask=offs_m < N, other=0.0)
    delta = tl.load(delta_ptr + bh.to(tl.int64) * N + offs_m, mask=offs_m < N, other=0.0)
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    dq = tl.zeros((BLOCK_M, D), tl.float32)
    hi = tl.minimum(start_m + BLOCK_M, N_K) if CAUSAL else N_K  # keys right of the diagonal: skipped
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None], mask=offs_n[None, :] < N_K, other=0.0)
        vt = tl.load(v_base + offs_n[None, :] * stride_vn + offs_d[:, None], mask=offs_n[None, :] < N_K, other=0.0)
        keep = (offs_n[None, :] < N_K) & (offs_m[:, None] < N)
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        p = tl.where(keep, tl.exp2(_dot(q, kt, None) * qk_scale - lse[:, None]), 0.0)
        dp = _dot(do, vt, None)
        ds = p * (dp - delta[:, None])
        dq = _dot(ds.to(kt.dtype), tl.trans(kt), dq)
    out = (b * H + h) * N * D + offs_m[:, None] * D + offs_d[None, :]
    tl.store(dq_ptr + out, (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=q_mask)


# ---------------------------------------------------------------------------------------------
# Tile sizes. On a GPU the forward is autotuned over a few configs (keyed on lengths, d and the mask);
# the interpreter runs small fixed tiles (every program is Python there).
# The four that won somewhere on an H200 (bf16, 4 x 16 heads, d = 128, twelve candidates timed in
# alternating rounds): 128 x 128 / 128 x 64 tiles with 8 warps at long N; 64 x 64 with 4 warps at
# N <= 4096 with the causal mask (more, shorter programs) and at short N.
FWD_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
               for bm, bn, w, s in [(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)]]
# (BLOCK_M, BLOCK_N, num_warps, num_stages) of the two backward kernels (the best of six on that H200)
BWD_TILES = {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (64, 64, 4, 3), 128: (64, 64, 4, 2)}
INTERP_FWD = (32, 16)  # BLOCK_M, BLOCK_N: several tiles (and a two-tile diagonal) even at a few dozen tokens
INTERP_BWD = (16, 32)

attn_fwd_autotuned = attn_fwd_kernel if INTERPRETED else triton.autotune(
    FWD_CONFIGS, key=["N", "N_K", "D", "CAUSAL"])(attn_fwd_kernel)
_fwd, _delta, _dkdv, _dq = map(Launcher, (attn_fwd_kernel, attn_bwd_delta_kernel, attn_bwd_dkdv_kernel,
                                          attn_bwd_dq_kernel))


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                      tiles: tuple[int, int, int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel alone: (o, lse), lse the fp32 log2-sum-exp2 of each row's scaled scores.

    tiles=(BLOCK_M, BLOCK_N, num_warps, num_stages) fixes the tile sizes (BLOCK_M a multiple of BLOCK_N);
    None autotunes on a GPU.
    """
    B, H, N, D = q.shape
    N_K = k.shape[2]
    o = torch.empty(B, H, N, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(B * H, N, dtype=torch.float32, device=q.device)
    args = (q, k, v, o, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(o), H, N, N_K, scale * LOG2E)
    if tiles is None and INTERPRETED:
        tiles = (*INTERP_FWD, 1, 1)
    if tiles is not None:
        bm, bn, warps, stages = tiles
        if bm % bn:
            raise ValueError(f"attention: BLOCK_M ({bm}) must be a multiple of BLOCK_N ({bn}).")
        _fwd((cdiv(N, bm), B * H), args, dict(D=D, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal),
             num_warps=warps, num_stages=stages)
    else:
        attn_fwd_autotuned[lambda meta: (cdiv(N, meta["BLOCK_M"]), B * H)](*args, D=D, CAUSAL=causal)
    return o, lse


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, causal: bool,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernels alone: (dq, dk, dv), contiguous, in q's dtype."""
    B, H, N, D = q.shape
    N_K = k.shape[2]
    if do.stride(-1) != 1:
        do = do.contiguous()
    dq = torch.empty(B, H, N, D, dtype=q.dtype, device=q.device)
    dk = torch.empty(B, H, N_K, D, dtype=k.dtype, device=q.device)
    dv = torch.empty(B, H, N_K, D, dtype=v.dtype, device=q.device)
    delta = torch.empty(B * H, N, dtype=torch.float32, device=q.device)
    if INTERPRETED:
        bm, bn, warps, stages = (*INTERP_BWD, 1, 1)
    else:
        bm, bn, warps, stages = BWD_TILES[D]
    _delta((cdiv(N, 64), B * H), (o, do, delta, *_strides(o), *_strides(do), H, N), dict(D=D, BLOCK_M=64),
           num_warps=4 if not INTERPRETED else 1)
    common = (*_strides(q), *_strides(k), *_strides(v), *_strides(do), H, N, N_K, scale * LOG2E, scale)
    kw = dict(D=D, CAUSAL=causal, num_warps=warps, num_stages=stages)
    _dkdv.launch((cdiv(N_K, bn), B * H), (q, k, v, do, lse, delta, dk, dv, *common), dict(BLOCK_M=bm, BLOCK_N=bn, **kw))
    _dq.launch((cdiv(N, bn), B * H), (q, k, v, do, lse, delta, dq, *common), dict(BLOCK_M=bn, BLOCK_N=bm, **kw))
    return dq, dk, dv


class Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        o, lse = attention_forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(do, q, k, v, o, lse, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


_attention_apply = compat.autograd_apply(Attention)  # Attention.apply without the Python wrapper's per-call checks


def _last_dim_unit(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None) -> torch.Tensor:
    """FlashAttention: softmax(q kᵀ · scale) v over the last two dims, differentiable in q, k and v.

    q: (B, H, N, d), k and v: (B, H, Nk, d), one dtype (fp16 or bf16), d in HEAD_DIMS, any N, Nk >= 1.
    causal masks key j > query i (top-left aligned, as scaled_dot_product_attention's is_causal).
    scale defaults to 1/sqrt(d). Inputs are read through their strides (a copy only when the last dim
    is not contiguous); the same layout as scaled_dot_product_attention.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor("attention", name, t, DTYPES)
    check_same_device("attention", q=q, k=k, v=v)
    check_same_dtype("attention", q=q, k=k, v=v)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attention: q, k, v must be 4-D (batch, heads, tokens, head_dim); got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}. For (batch, tokens, heads, "
                         f"head_dim) pass x.transpose(1, 2); add missing dims with x[None].")
    B, H, N, D = q.shape
    if k.shape != v.shape or k.shape[:2] != (B, H) or k.shape[3] != D:
        raise ValueError(f"attention: k and v must have shape (B, H, Nk, d) = ({B}, {H}, Nk, {D}) to match q; got "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)} (for grouped heads, repeat k and v per head).")
    if D not in HEAD_DIMS:
        raise ValueError(f"attention: head dim {D} is not supported; use one of {HEAD_DIMS} (pad q, k, v with zeros "
                         f"up to the next one, and pass scale={D ** -0.5:.6g} to keep the softmax unchanged).")
    if N == 0 or k.shape[2] == 0:
        raise ValueError(f"attention: q has {N} and k {k.shape[2]} tokens; both need at least one.")
    if B * H > 65535:
        raise ValueError(f"attention: batch x heads = {B * H} exceeds the grid's 65535; split the batch.")
    scale = D ** -0.5 if scale is None else float(scale)
    if not scale > 0:
        raise ValueError(f"attention: scale must be positive; got {scale}.")
    return _attention_apply(_last_dim_unit(q), _last_dim_unit(k), _last_dim_unit(v), bool(causal), scale)
