"""softmax over the last dim: y = exp(x - max(x)) / sum(exp(x - max(x))), row by row.

With x of shape (..., N) holding n elements: bytes: read x once, write y once: 2 * n * element_size.
FLOPs: about 4 per element (subtract, exp, add, divide). Memory-bound: one pass over memory when
a whole row fits in registers. Longer rows (and rows too few to fill the GPU) are split into chunks
across programs (see softmax_split_kernel), so each element is still read once and written once, with
one exp per element. On Hopper GPUs those rows go instead to one CUDA kernel per row cluster (see
_softmax_cluster): its blocks exchange partials through distributed shared memory, which Triton cannot
reach. The streaming kernel (two reads of each row) is kept for teaching and testing.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from labkit import compat
from labkit.kernels.cluster import rtc
from labkit.kernels._common import (INTERPRETED, SPLIT_STAGES, Launcher, PlanCache, arrive, cdiv,
                                    check_tensor, next_pow2, num_sms, row_tile, rows_2d, split_exchange, split_ticket,
                                    wait_for)

# Longest row kept whole in registers (one read, one write); longer rows are split across programs.
MAX_FUSED_COLS = {torch.float32: 16384, torch.float16: 32768, torch.bfloat16: 32768}
# The streaming kernel: BLOCK elements per step, ONLINE_WARPS warps, ONLINE_PROGRAMS_PER_SM programs per SM.
ONLINE_BLOCK, ONLINE_WARPS, ONLINE_PROGRAMS_PER_SM = 8192, 16, 4
# Split rows: each program holds SPLIT_CHUNK elements of a row in registers (SPLIT_WARPS warps); swept on
# an H200 at 1024x65536 and 256x131072 (fp32 and bf16).
SPLIT_CHUNK = 8192
SPLIT_WARPS = 4
# Split rows on Hopper (labkit/kernels/cluster/softmax_cluster.cu): each block of a cluster holds CLUSTER_THREADS x
# CLUSTER_VECS 16-byte vectors of its row in registers (64 KB); a row takes 2 to MAX_CLUSTER blocks. Where that
# leaves at least one block per SM, blocks also stage CLUSTER_STAGED_VECS vectors a thread in shared memory (128
# KB a block; a row takes 1 to MAX_CLUSTER). Else, when the plain blocks give fewer than CLUSTER_MIN_BLOCKS_PER_SM
# blocks per SM, blocks of half as many threads (more, smaller blocks: 2-3 points better at 256 rows). Swept on
# an H200 at 1024x65536, 512x131072, 256x131072 and 256x65536 (fp32, bf16) against 128-1024 threads, 4-16
# vectors in registers and 0-24 in shared memory; checked again after the kernel became one pass while loading
# (128 threads: +0.8 points at 256x131072 bf16, 1-5 worse at the other shapes; 1024 threads: 71% there). Swept
# again on an H100 (2026-11-28, L2 flushed; 128-1024 threads, 0-24 staged vectors, the least cluster and twice
# it) at 256 and 1024 x 65536 and 256 and 512 x 131072, fp32 and bf16: these choices within 1.5% of the best at
# every shape. At 256x65536 bf16 (28.4 us, 80% of the 3,008 GB/s a long copy reaches) a copy of the same 67 MB
# took 27.8 us: the kernel runs at the speed of a copy of its bytes, which at that size is 80% of a long one's.
CLUSTER_THREADS, CLUSTER_VECS, CLUSTER_STAGED_VECS, CLUSTER_MIN_BLOCKS_PER_SM = 512, 8, 8, 12
MAX_CLUSTER = rtc.MAX_CLUSTER


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
    # Pass 2 reads the row again and writes exp(x - max) / sum. The cache hints keep the row in L2
    # for pass 2 (evict_last) and stop the output from pushing it out (.cs: streaming stores).
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        x_row = x_ptr + tl.cast(row, tl.int64) * stride_x
        y_row = y_ptr + tl.cast(row, tl.int64) * stride_y
        m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK_N,), tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < N, other=float("-inf"), eviction_policy="evict_last")
            x = x.to(tl.float32)
            m_new = tl.maximum(m, x)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # lanes that have seen only padding
            s = s * tl.exp(m - m_safe) + tl.exp(x - m_safe)
            m = m_new
        row_max = tl.max(m, axis=0)
        row_sum = tl.sum(s * tl.exp(tl.where(m == float("-inf"), float("-inf"), m - row_max)), axis=0)
        inv = 1.0 / row_sum
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_first").to(tl.float32)
            tl.store(y_row + cols, (tl.exp(x - row_max) * inv).to(y_ptr.dtype.element_ty), mask=cols < N,
                     cache_modifier=".cs")


@triton.jit
def softmax_split_kernel(x_ptr, y_ptr, part_ptr, count_ptr, M, N, stride_x, stride_y, SPLITS,
                         CHUNK: tl.constexpr, SPLITS_P2: tl.constexpr, STAGE: tl.constexpr):
    # x_ptr, y_ptr: rows of the input / output; part_ptr: fp32 (M, SPLITS, 2), each chunk's max and
    # sum of exp(x - max); count_ptr: int32 (M + 1,) zeros: count[row] counts the row's finished
    # chunks, count[M] hands out work tickets.
    # Few, long rows: one program per row would leave SMs idle and re-read the row. Instead each
    # program keeps one CHUNK of a row in registers, publishes its partial (max, sum), waits for the
    # row's other chunks, then normalises the chunk it still holds: one read, one write. It keeps
    # e = exp(x - chunk max), so normalising is e * exp(chunk max - row max) / row sum: one exp per element.
    # STAGE 0 on the GPU (one launch); STAGE 1 then 2 in the interpreter (see split_ticket).
    row, s = split_ticket(count_ptr + M, SPLITS, STAGE)
    cols = s * CHUNK + tl.arange(0, CHUNK)
    mask = cols < N
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=mask, other=float("-inf")).to(tl.float32)
    part = part_ptr + row.to(tl.int64) * SPLITS * 2
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # a chunk of -inf only: e and its sum are 0
    e = tl.exp(x - m_safe)
    if STAGE != 2:
        tl.store(part + 2 * s, m)
        tl.store(part + 2 * s + 1, tl.sum(e, axis=0))
        if STAGE == 0:
            arrive(count_ptr + row)
            wait_for(count_ptr + row, SPLITS)
    if STAGE != 1:
        j = tl.arange(0, SPLITS_P2)
        pm = tl.load(part + 2 * j, mask=j < SPLITS, other=float("-inf"), volatile=True)
        ps = tl.load(part + 2 * j + 1, mask=j < SPLITS, other=0.0, volatile=True)
        row_max = tl.max(pm, axis=0)
        row_sum = tl.sum(ps * tl.exp(pm - row_max), axis=0)
        scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - row_max) / row_sum)
        tl.store(y_ptr + row.to(tl.int64) * stride_y + cols, (e * scale).to(y_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor, online: bool | None = None, split: bool | None = None) -> torch.Tensor:
    """Softmax over the last dim of x (fp32, fp16 or bf16; any leading shape), in fp32 math.

    Rows are read through their stride; a copy is made only when the last dim is not contiguous.
    online: None picks the one-pass kernel when a row fits (see MAX_FUSED_COLS), True forces the
    streaming kernel (for teaching and testing), False forces one pass.
    split: None splits rows across programs when they are too long for one (or too few to fill the
    GPU, see use_split); True forces it (testing), False never (then long rows stream). On a Hopper GPU
    split rows go to the CUDA cluster kernel (labkit/kernels/cluster/softmax_cluster.cu) when they are 16-byte aligned.
    Differentiable: when x requires grad, the backward is dx = y * (dy - sum(dy * y)) (in PyTorch, fp32).
    """
    if getattr(x, "requires_grad", False) and torch.is_grad_enabled():  # builds_graph(x), a call fewer
        return _softmax_apply(x, online, split)
    return _softmax(x, online, split)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, online, split):
        y = _softmax(x, online, split)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        y32, dy32 = y.float(), dy.float()
        dx = y32 * (dy32 - (dy32 * y32).sum(dim=-1, keepdim=True))
        return dx.to(y.dtype), None, None


_softmax_apply = compat.autograd_apply(_Softmax)  # _Softmax.apply without the Python wrapper's per-call checks


def use_split(M: int, N: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Split rows across programs when a row is too long for one program, or when there are too few
    rows to fill every SM twice and each row still gives several chunks."""
    return N > MAX_FUSED_COLS[dtype] or (M < 2 * num_sms(device) and N >= 2 * SPLIT_CHUNK)


def _softmax_split(x2: torch.Tensor, y: torch.Tensor) -> None:
    M, N = x2.shape
    chunk = min(SPLIT_CHUNK, next_pow2(N))
    splits = cdiv(N, chunk)
    part, count = split_exchange(M, splits, x2.device)
    args = (x2, y, part, count, M, N, x2.stride(0), y.stride(0), splits)
    for stage in SPLIT_STAGES:
        _split.launch((M * splits,), args, dict(CHUNK=chunk, SPLITS_P2=next_pow2(splits), STAGE=stage,
                                                num_warps=1 if INTERPRETED else SPLIT_WARPS))


def cluster_size(N: int, dtype: torch.dtype, threads: int | None = None, staged: int = 0) -> int | None:
    """Blocks per row cluster for rows of N elements (a power of two up to MAX_CLUSTER; at least 2 unless blocks
    stage `staged` vectors a thread in shared memory), None if too long."""
    block_cols = (threads or CLUSTER_THREADS) * (CLUSTER_VECS + staged) * 16 // (torch.finfo(dtype).bits // 8)
    blocks = max(1 if staged else 2, next_pow2(cdiv(N, block_cols)))
    return blocks if blocks <= MAX_CLUSTER else None


def cluster_launch(M: int, N: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int, int] | None:
    """(threads per block, vectors a thread stages in shared memory, blocks per cluster) for M rows of N
    elements, None if the rows are too long."""
    staged = cluster_size(N, dtype, staged=CLUSTER_STAGED_VECS)
    if staged is not None and M * staged >= num_sms(device):
        return CLUSTER_THREADS, CLUSTER_STAGED_VECS, staged
    cluster = cluster_size(N, dtype)
    if cluster is None:
        return None
    small = cluster_size(N, dtype, CLUSTER_THREADS // 2)
    if M * cluster < CLUSTER_MIN_BLOCKS_PER_SM * num_sms(device) and small is not None:
        return CLUSTER_THREADS // 2, 0, small
    return CLUSTER_THREADS, 0, cluster


def _cluster_plan(M: int, N: int, dtype: torch.dtype, device: torch.device) -> tuple | None:
    """(kernel, blocks, threads, 16-byte vectors a row) of the cluster kernel for M rows of N elements; None where it
    cannot run: not a Hopper GPU, rows not whole 16-byte vectors, rows too long, or no NVRTC."""
    per_vec = 16 // dtype.itemsize  # elements per 16-byte vector
    index = rtc.cluster_index(device)
    launch = cluster_launch(M, N, dtype, device) if index is not None and N % per_vec == 0 else None
    if launch is None or M * launch[2] >= 2**31:
        return None
    threads, staged, cluster = launch
    compiled = rtc.cluster_kernel("softmax", "softmax_cluster.cu", "softmax_cluster", index, threads * staged * 16,
                                  CLUSTER=cluster, THREADS=threads, VECS=CLUSTER_VECS, SVECS=staged,
                                  ELEM=rtc.ELEM[dtype])
    return None if compiled is None else (compiled[0], M * cluster, threads, N // per_vec)


def _softmax_cluster(x2: torch.Tensor, y: torch.Tensor, plan: tuple | None = None) -> bool:
    """Softmax of x2's rows into y (contiguous) by the cluster kernel of `plan` (_cluster_plan's, worked out here
    if not given); False (nothing done) where it cannot run (see _cluster_plan) or x2's rows are not whole
    16-byte vectors (stride, start)."""
    if plan is None:
        plan = _cluster_plan(*x2.shape, x2.dtype, x2.device)
    if plan is None or not rtc.vector_rows(x2):
        return False
    kernel, blocks, threads, vecs = plan
    kernel(blocks, threads, x2, y, vecs, x2.stride(0) * x2.element_size() // 16, vecs)
    return True


# Launch plans by (M, N, dtype, device, online, split): worked out on a kind of call's first call (see _plan).
_PLANS = PlanCache()
_one_pass, _online, _split = Launcher(softmax_kernel), Launcher(softmax_online_kernel), Launcher(softmax_split_kernel)


def _plan(M: int, N: int, dtype: torch.dtype, device: torch.device, online: bool | None,
          split: bool | None) -> tuple:
    """("split", _cluster_plan's) or (launcher, grid, constexprs and num_warps) of the one-pass or streaming
    kernel."""
    if split is None:
        split = online is None and use_split(M, N, dtype, device)
    if split:
        return ("split", _cluster_plan(M, N, dtype, device))
    if online is None:
        online = N > MAX_FUSED_COLS[dtype]
    if not online:
        # Tiles of at least 1024 (fp32) / 2048 (16-bit) elements, 16 values per thread.
        bm, bn, warps = row_tile(N, 1024 if dtype == torch.float32 else 2048, 16)
        return _one_pass, (cdiv(M, bm),), dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
    block = min(ONLINE_BLOCK, next_pow2(N))
    programs = min(M, ONLINE_PROGRAMS_PER_SM * num_sms(device))
    return _online, (programs,), dict(BLOCK_N=block, num_warps=1 if INTERPRETED else ONLINE_WARPS)


def _softmax(x: torch.Tensor, online: bool | None = None, split: bool | None = None) -> torch.Tensor:
    check_tensor("softmax", "x", x)
    if x.dim() == 0:
        raise ValueError("softmax: x must have at least one dimension; got a 0-d tensor (use x.reshape(1)).")
    x2 = rows_2d(x)
    M, N = x2.shape
    dtype, device = x.dtype, x.device
    y = torch.empty(M, N, dtype=dtype, device=device)
    if not (M and N):
        return y.view(*x.shape)
    key = (M, N, dtype, device, online, split)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, _plan(M, N, dtype, device, online, split))
    if len(plan) == 2:  # split rows: the cluster kernel where it can run (alignment), else Triton's split kernel
        if plan[1] is None or not _softmax_cluster(x2, y, plan[1]):
            _softmax_split(x2, y)
    else:
        launcher, grid, meta = plan
        launcher.launch(grid, (x2, y, M, N, x2.stride(0), N), meta)
    return y if x.dim() == 2 else y.view(*x.shape)


# ---- labkit bench: the cases `labkit bench` times (see labkit/kernels/_bench.py)
from labkit.kernels._bench import BenchCase, Timed, bind, maybe_compile, peer, randn, rows_cols  # noqa: E402


def _bench(dims: tuple[int, ...], dtype: torch.dtype, use_compile: bool) -> Timed:
    M, N = rows_cols(dims)
    x = randn(M, N, dtype=dtype)
    return Timed(f"{M}x{N}", lambda: softmax(x),
                 {"eager": lambda: reference(x), "compile": bind(maybe_compile(reference, use_compile), x),
                  "liger": bind(peer("softmax"), x), "quack": bind(peer("softmax", "quack"), x)},
                 min_bytes((M, N), dtype))


def bench_cases() -> list[BenchCase]:
    # issue 39's five shapes (32768x1024 ... 256x131072) and the ones timed before
    return [BenchCase("softmax", _bench, gpu_sizes=("32768x1024", "65536x1024", "16384x4096", "4096x16384",
                                                  "256x65536", "1024x65536", "256x131072"),
                      cpu_sizes=("17x129",), baselines=("eager", "compile", "liger", "quack"))]
