"""Layer norm over the last dim: y = (x - mean) / sqrt(var + eps) * weight + bias, with backward.

With x of shape (..., N) holding n = M * N elements (M rows), weight and bias of shape (N,):
forward bytes: read x, weight, bias; write y (the 2M fp32 row statistics saved for the backward
are counted too): (2n + 2N) * element_size + 8M.
backward bytes: read dy, x, weight and the 2M statistics; write dx, dweight, dbias:
(3n + 3N) * element_size + 8M.
FLOPs: about 8 per element forward and 12 backward. Memory-bound.
The structure follows Triton's layer-norm tutorial: the backward writes partial sums of
dweight and dbias (one row per program), then adds those partial rows up. The backward's loop over
row tiles, and the forward's for rows wider than 8192, are pipelined by Triton (tl.range's
num_stages): the next rows load while this one reduces. Backward rows wider than 8192 are split
across programs (see layer_norm_bwd_split_kernel); on Hopper GPUs across the blocks of a thread-block
cluster instead (labkit/kernels/cluster/layer_norm_bwd_cluster.cu, see _backward_cluster), whose blocks exchange
their row sums through distributed shared memory, which Triton cannot reach.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from labkit import compat
from labkit.kernels.cluster import rtc
from labkit.kernels._common import (INTERPRETED, SPLIT_STAGES, Launcher, PlanCache, arrive, builds_graph, cdiv,
                                    check_inputs, finish_partials, finish_reducers, finish_targets, next_pow2,
                                    num_sms, pipeline_stages, row_tile, rows_2d, split_exchange, split_ticket,
                                    sum_partials, wait_for)

MAX_COLS = 16384  # a whole row is held in registers


def min_bytes(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, backward: bool = False) -> int:
    """Bytes the forward (or the backward) must move at least, for x of `shape`."""
    n, cols = math.prod(shape), shape[-1]
    rows = n // cols if cols else 0
    if backward:
        return (3 * n + 3 * cols) * dtype.itemsize + 8 * rows
    return (2 * n + 2 * cols) * dtype.itemsize + 8 * rows


def flops(shape: tuple[int, ...], backward: bool = False) -> int:
    return (12 if backward else 8) * math.prod(shape)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


@triton.jit
def _ln_fwd_tile(x_ptr, w, b, y_ptr, mean_ptr, rstd_ptr, tile, M, N, stride_x, stride_y, eps,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STATS: tl.constexpr):
    # Row tile `tile`: statistics in fp32 registers, one read of x, one write of y. w and b: pointers to
    # weight and bias (loaded here, after x), or their fp32 values, loaded once before a loop.
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < M, cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if w.dtype.is_ptr():
        w = tl.load(w + cols, mask=col_mask, other=0.0).to(tl.float32)
        b = tl.load(b + cols, mask=col_mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)  # padding must not count in the variance
    var = tl.sum(xc * xc, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + rows64 * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    if STATS:  # (not kept when no backward will need them)
        tl.store(mean_ptr + rows, mean, mask=row_mask)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, stride_x, stride_y, eps, n_tiles,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, STATS: tl.constexpr):
    # x_ptr, y_ptr: (M, N) rows; w_ptr, b_ptr: (N,); mean_ptr, rstd_ptr: fp32 (M,) for the backward, written if STATS.
    # STAGES 0: one program per tile of BLOCK_M whole rows. A row too wide for two programs to share an SM
    # would leave memory idle while its one program reduces, so there (STAGES > 0) each SM runs one program
    # over tiles p, p + P, ...: Triton pipelines that loop, loading the next tiles into shared memory meanwhile
    # (weight and bias are loaded once, before it, so only x takes shared memory).
    if STAGES == 0:
        _ln_fwd_tile(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, tl.program_id(0), M, N, stride_x, stride_y,
                     eps, BLOCK_M, BLOCK_N, STATS)
    else:
        cols = tl.arange(0, BLOCK_N)
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=STAGES):
            _ln_fwd_tile(x_ptr, w, b, y_ptr, mean_ptr, rstd_ptr, tile, M, N, stride_x, stride_y, eps, BLOCK_M,
                         BLOCK_N, STATS)


@triton.jit
def layer_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr, dwb_ptr, count_ptr, M, N,
                          stride_dy, stride_x, stride_dx, n_row_tiles,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
                          REDUCERS: tl.constexpr):
    # Program p handles row tiles p, p + P, p + 2P, ... (P programs): it writes dx for those rows
    # and sums dy * xhat and dy over them, then stores the two partial sums as row p of
    # dw_partial / db_partial, fp32 (2, P, N) in partial_ptr. The last REDUCERS programs to finish add the P
    # partial rows up into dwb_ptr, (2, N) in the weight's dtype (finish_partials); with REDUCERS 0 the caller does.
    # Triton pipelines the loop STAGES deep: the next tiles' x and dy are copied into shared memory while
    # this tile is reduced and written, so the loads never stop.
    p = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in tl.range(p, n_row_tiles, n_programs, num_stages=STAGES):
        rows = t * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        x = tl.load(x_ptr + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        wdy = w[None, :] * dy
        # dx = rstd * (w dy - mean(w dy) - xhat * mean(xhat w dy))
        c1 = tl.sum(xhat * wdy, axis=1) / N
        c2 = tl.sum(wdy, axis=1) / N
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + rows64 * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += dy * xhat
        db_acc += dy
    tl.store(partial_ptr + p * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
    tl.store(partial_ptr + (n_programs + p) * N + cols, tl.sum(db_acc, axis=0), mask=col_mask)
    if REDUCERS > 0:
        finish_partials(partial_ptr, dwb_ptr, count_ptr, 2, n_programs, N, n_programs, REDUCERS)


# Wide backward rows, split. A whole row of x and dy plus the two row-wide accumulators of dweight and
# dbias fill one program's registers, so its loads stop while it reduces and stores. Instead SPLITS programs
# share each row, one CHUNK of columns each, and add up their partial row sums through memory (as softmax's
# split rows do). Program (group g, chunk k) walks rows g, g + GROUPS, ..., issuing the loads of its next
# row's chunk before it publishes this row's partials and waits for the other chunks'.


@triton.jit
def _row_chunk(ptr, row, stride, cols, col_mask, M):
    # Columns `cols` of row `row` in their own dtype (zeros past the last column). A row past the last
    # reads the last row again, unused (the interpreter takes no mask mixing a scalar row test in).
    return tl.load(ptr + tl.cast(tl.minimum(row, M - 1), tl.int64) * stride + cols, mask=col_mask, other=0.0)


@triton.jit
def layer_norm_bwd_split_kernel(part_ptr, count_ptr, M, SPLITS, GROUPS, dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr,
                                dx_ptr, partial_out_ptr, N, stride_dy, stride_x, stride_dx,
                                CHUNK: tl.constexpr, SPLITS_P2: tl.constexpr, STAGE: tl.constexpr):
    # part_ptr: fp32 (M, SPLITS, 2), each chunk's sums of xhat * w * dy and of w * dy; count_ptr: int32
    # (M + 1,) zeros, count[row] counts the chunks published, count[M] hands out tickets (see split_ticket).
    # partial_out_ptr: fp32 (2, GROUPS, N), one partial row of dweight and one of dbias per group, added up afterwards.
    g, k = split_ticket(count_ptr + M, SPLITS, STAGE)
    cols = k * CHUNK + tl.arange(0, CHUNK)
    col_mask = cols < N
    j = tl.arange(0, SPLITS_P2)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((CHUNK,), dtype=tl.float32)
    db_acc = tl.zeros((CHUNK,), dtype=tl.float32)
    x_next = _row_chunk(x_ptr, g, stride_x, cols, col_mask, M)
    dy_next = _row_chunk(dy_ptr, g, stride_dy, cols, col_mask, M)
    for r in range(g, M, GROUPS):
        x, dy = x_next.to(tl.float32), dy_next.to(tl.float32)
        x_next = _row_chunk(x_ptr, r + GROUPS, stride_x, cols, col_mask, M)
        dy_next = _row_chunk(dy_ptr, r + GROUPS, stride_dy, cols, col_mask, M)
        mean, rstd = tl.load(mean_ptr + r), tl.load(rstd_ptr + r)
        xhat = tl.where(col_mask, (x - mean) * rstd, 0.0)
        wdy = w * dy
        part = part_ptr + tl.cast(r, tl.int64) * SPLITS * 2
        if STAGE != 2:
            tl.store(part + 2 * k, tl.sum(xhat * wdy, axis=0))
            tl.store(part + 2 * k + 1, tl.sum(wdy, axis=0))
            if STAGE == 0:
                arrive(count_ptr + r)
                wait_for(count_ptr + r, SPLITS)
        if STAGE != 1:
            c1 = tl.sum(tl.load(part + 2 * j, mask=j < SPLITS, other=0.0, volatile=True), axis=0) / N
            c2 = tl.sum(tl.load(part + 2 * j + 1, mask=j < SPLITS, other=0.0, volatile=True), axis=0) / N
            dx = (wdy - (xhat * c1 + c2)) * rstd
            tl.store(dx_ptr + tl.cast(r, tl.int64) * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=col_mask)
            dw_acc += dy * xhat
            db_acc += dy
    if STAGE != 1:
        tl.store(partial_out_ptr + g * N + cols, dw_acc, mask=col_mask)
        tl.store(partial_out_ptr + (GROUPS + g) * N + cols, db_acc, mask=col_mask)


class WideRows(NamedTuple):
    """Forward rows of `from_cols` columns or more go one at a time, on `warps` warps, one program per SM, its loop
    pipelined `stages` deep (bf16 4096x16384: 0.84x the time of two-row tiles)."""
    from_cols: int
    warps: int
    stages: int


class SplitRows(NamedTuple):
    """Backward rows of `from_cols` columns or more are split (layer_norm_bwd_split_kernel) into chunks of `chunk`
    columns on `warps` warps, `per_sm` programs per SM. At 16384 columns the whole-row kernel's two row-wide
    accumulators fill its registers: even pipelined it took 1.1x (bf16) the split's time."""
    from_cols: int
    chunk: int
    warps: int
    per_sm: int


class ClusterPlan(NamedTuple):
    """The Hopper cluster backward (labkit/kernels/cluster/layer_norm_bwd_cluster.cu): threads, 16-byte vectors per
    thread, rows in flight in shared memory, blocks per SM."""
    threads: int
    vecs: int
    stages: int
    per_sm: int


# Tile choices (swept on an H200). Forward: (min elements per tile, values per thread) by dtype, and the row
# width from which a tile holds two rows.
FWD_TILE = {torch.float32: (1024, 16), torch.float16: (4096, 32), torch.bfloat16: (4096, 32)}
FWD_TWO_ROWS_FROM = {torch.float32: 1 << 30, torch.float16: 4096, torch.bfloat16: 4096}
# At most 8 warps for a 16-bit tile: bf16 8192x8192 took 119 us with 16 warps, 95 us with 8 (H100, 2026-11-27;
# 16384x8192 230 -> 183 us); 1-4096 columns never asked for more than 8.
FWD_MAX_WARPS = {torch.float32: 32, torch.float16: 8, torch.bfloat16: 8}
FWD_WIDE = WideRows(from_cols=8193, warps=16, stages=3)
# Backward: tiles of at least BWD_TILE[dtype] elements, BWD_VALUES_PER_THREAD values per thread, one program per
# SM, its loop pipelined BWD_STAGES deep (8192x8192 bf16: 0.6x the time of the unpipelined kernel it replaced).
BWD_TILE = {torch.float32: 4096, torch.float16: 8192, torch.bfloat16: 8192}
BWD_VALUES_PER_THREAD = 32
BWD_STAGES = 3
BWD_SPLIT = SplitRows(from_cols=8193, chunk=4096, warps=4, per_sm=2)
# swept on an H200 from 1024x65536 to 16384x16384 (fp16 takes bf16's, not timed)
BWD_CLUSTER = {torch.float32: ClusterPlan(256, 4, 4, 1), torch.float16: ClusterPlan(512, 2, 4, 1),
               torch.bfloat16: ClusterPlan(512, 2, 4, 1)}


def _fwd_plan(M: int, N: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int, int, int, int]:
    """(programs, BLOCK_M, BLOCK_N, num_warps, STAGES) of the forward (STAGES 0: one tile per program)."""
    from_cols, wide_warps, stages = FWD_WIDE
    if N >= from_cols:
        bn = next_pow2(N)
        return (min(M, num_sms(device)), 1, bn, 1 if INTERPRETED else wide_warps,
                pipeline_stages(device, bn * dtype.itemsize, stages))
    min_tile, per_thread = FWD_TILE[dtype]
    if N >= FWD_TWO_ROWS_FROM[dtype]:  # 16-bit rows of 4096+: two rows a tile kept more bytes in flight
        min_tile = max(min_tile, 2 * next_pow2(N))
    bm, bn, warps = row_tile(N, min_tile, per_thread, FWD_MAX_WARPS[dtype])
    return cdiv(M, bm), bm, bn, warps, 0


def _bwd_plan(M: int, N: int, dtype: torch.dtype, device: torch.device) -> tuple[int, int, int, int, int]:
    """(programs, BLOCK_M, BLOCK_N, num_warps, STAGES) of the whole-row backward."""
    bm, bn, warps = row_tile(N, BWD_TILE[dtype], BWD_VALUES_PER_THREAD)
    stages = pipeline_stages(device, 2 * bm * bn * dtype.itemsize, BWD_STAGES)  # x and dy of a tile
    return max(1, min(cdiv(M, bm), num_sms(device))), bm, bn, warps, stages


def _split_plan(M: int, N: int, device: torch.device) -> tuple[int, int, int, int] | None:
    """(CHUNK, SPLITS, GROUPS, num_warps) when backward rows of N columns are split, else None."""
    from_cols, chunk, warps, per_sm = BWD_SPLIT
    if N < from_cols:
        return None
    chunk = min(chunk, next_pow2(N))
    splits = cdiv(N, chunk)
    return chunk, splits, max(1, min(M, per_sm * num_sms(device) // splits)), 1 if INTERPRETED else warps


# Launch plans by (M, N, dtype, device): the plan functions above run once per kind of call, not per call.
_FWD_PLANS, _BWD_PLANS = PlanCache(), PlanCache()
_fwd, _bwd, _bwd_split = (Launcher(k) for k in (layer_norm_fwd_kernel, layer_norm_bwd_kernel,
                                                layer_norm_bwd_split_kernel))


def _fwd_launch(M: int, N: int, dtype: torch.dtype, device: torch.device, stats: bool = True
                ) -> tuple[tuple, int, dict]:
    """(grid, row tiles, constexprs and num_warps) of the forward, from _fwd_plan, cached."""
    key = (M, N, dtype, device, stats)
    found = _FWD_PLANS.get(key)
    if found is None:
        programs, bm, bn, warps, stages = _fwd_plan(M, N, dtype, device)
        found = _FWD_PLANS.put(key, ((programs,), cdiv(M, bm),
                                     dict(BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, STATS=stats, num_warps=warps)))
    return found


def layer_norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5,
                       stats: bool = True):
    """The forward kernel alone: (y, mean, rstd), the last two fp32 per row (for the backward); (y, None, None)
    without `stats` (two allocations and 8 bytes a row fewer)."""
    x2 = rows_2d(x)
    M, N = x2.shape
    device = x.device
    y = torch.empty(M, N, dtype=x.dtype, device=device)
    mean = rstd = None
    if stats:
        mean = torch.empty(M, dtype=torch.float32, device=device)
        rstd = torch.empty(M, dtype=torch.float32, device=device)
    if M and N:
        grid, tiles, meta = _fwd_launch(M, N, x.dtype, device, stats)
        stat_ptrs = (mean, rstd) if stats else (y, y)  # (unwritten without STATS: any pointer will do)
        _fwd.launch(grid, (x2, weight, bias, y, *stat_ptrs, M, N, x2.stride(0), N, eps, tiles), meta)
    return (y if x.dim() == 2 else y.view(*x.shape)), mean, rstd


def _bwd_launch(M: int, N: int, dtype: torch.dtype, device: torch.device) -> tuple:
    """("split", _split_plan, _cluster_plan) for split rows, else ("rows", grid, programs, row tiles, constexprs,
    the same with finish_partials' REDUCERS), cached."""
    key = (M, N, dtype, device)
    found = _BWD_PLANS.get(key)
    if found is None:
        split = _split_plan(M, N, device)
        if split is not None:
            found = ("split", split, _cluster_plan(M, N, dtype, device))
        else:
            programs, bm, bn, warps, stages = _bwd_plan(M, N, dtype, device)
            meta = dict(BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, num_warps=warps)
            found = ("rows", (programs,), programs, cdiv(M, bm), dict(meta, REDUCERS=0),
                     dict(meta, REDUCERS=finish_reducers(programs, device)))
        _BWD_PLANS.put(key, found)
    return found


def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                        rstd: torch.Tensor, stacked: bool = False) -> tuple[torch.Tensor, ...]:
    """The backward kernels alone: (dx, dweight, dbias), or (dx, dweight and dbias stacked (2, N)) if `stacked`."""
    x2, dy2 = rows_2d(x), rows_2d(dy)
    M, N = x2.shape
    device = x.device
    dx = torch.empty(M, N, dtype=x.dtype, device=device)
    if not (M and N):  # no rows (or no columns): nothing to add up
        dwb = torch.zeros(2, N, dtype=weight.dtype, device=device)
        return (dx.view(*x.shape), dwb) if stacked else (dx.view(*x.shape), *dwb.unbind())
    plan = _bwd_launch(M, N, x.dtype, device)
    if plan[0] == "rows":  # whole rows; their partial sums added up in the same launch where a counter is kept
        _, grid, programs, tiles, meta, fused = plan
        partial, out, counter, summed = finish_targets((2, programs, N), (2, N), weight.dtype, device)
        _bwd.launch(grid, (dy2, x2, weight, mean, rstd, dx, partial, out, counter, M, N, dy2.stride(0), x2.stride(0),
                           N, tiles), fused if summed else meta)
    else:  # split rows: the cluster kernel where it can run, else Triton's split kernel
        partial = None if plan[2] is None else _backward_cluster(dy2, x2, weight, mean, rstd, dx, plan[2])
        if partial is None:
            partial = _backward_split(dy2, x2, weight, mean, rstd, dx, plan[1])
        summed = False
    dwb = out if summed else sum_partials(partial, weight.dtype)  # (a CUDA graph's capture: summed here too)
    dx = dx if x.dim() == 2 else dx.view(*x.shape)
    return (dx, dwb) if stacked else (dx, *dwb.unbind())  # (unbind: one call, not a Python loop over rows)


def _backward_split(dy2: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                    rstd: torch.Tensor, dx: torch.Tensor, plan: tuple[int, int, int, int]) -> torch.Tensor:
    """dx written by Triton's split kernel (`plan` from _split_plan), and its fp32 (2, groups, N) partial sums."""
    M, N = x2.shape
    chunk, splits, groups, split_warps = plan
    partial = torch.empty(2, groups, N, dtype=torch.float32, device=x2.device)
    exchange, count = split_exchange(M, splits, x2.device)
    args = (exchange, count, M, splits, groups, dy2, x2, weight, mean, rstd, dx, partial, N, dy2.stride(0),
            x2.stride(0), dx.stride(0))
    for stage in SPLIT_STAGES:
        _bwd_split.launch((groups * splits,), args, dict(CHUNK=chunk, SPLITS_P2=next_pow2(splits), STAGE=stage,
                                                         num_warps=split_warps))
    return partial


def _cluster_plan(M: int, N: int, dtype: torch.dtype, device: torch.device) -> tuple | None:
    """(kernel, blocks, threads, clusters, 16-byte vectors a row) of the backward's cluster kernel for M rows of N
    elements; None where it cannot run: not a Hopper GPU, rows not whole 16-byte vectors or too long, no NVRTC."""
    threads, vecs, stages, per_sm = BWD_CLUSTER[dtype]
    per_vec = 16 // dtype.itemsize  # elements per 16-byte vector
    cluster = next_pow2(cdiv(N, threads * vecs * per_vec))
    index = rtc.cluster_index(device)
    if index is None or N % per_vec or cluster > rtc.MAX_CLUSTER:
        return None
    compiled = rtc.cluster_kernel("layer_norm backward", "layer_norm_bwd_cluster.cu", "layer_norm_bwd_cluster",
                                  index, stages * 2 * threads * vecs * 16, CLUSTER=cluster, THREADS=threads,
                                  VECS=vecs, STAGES=stages, ELEM=rtc.ELEM[dtype])
    if compiled is None:
        return None
    kernel, resident = compiled
    clusters = max(1, min(M, per_sm * num_sms(device) // cluster, resident))
    return kernel, clusters * cluster, threads, clusters, N // per_vec


def _backward_cluster(dy2: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                      rstd: torch.Tensor, dx: torch.Tensor, plan: tuple | None = None) -> torch.Tensor | None:
    """dx (contiguous) written by the cluster kernel of `plan` (_cluster_plan's, worked out here if not given), and
    its fp32 (2, clusters, N) partial sums of dweight and dbias; None (nothing done) where it cannot run (see
    _cluster_plan) or the rows of dy2, x2 or weight are not whole 16-byte vectors (stride, start)."""
    M, N = x2.shape
    if plan is None:
        plan = _cluster_plan(M, N, x2.dtype, x2.device)
    if plan is None or not (rtc.vector_rows(dy2) and rtc.vector_rows(x2) and weight.stride(-1) == 1
                            and weight.data_ptr() % 16 == 0):
        return None
    kernel, blocks, threads, clusters, vecs = plan
    partial = torch.empty(2, clusters, N, dtype=torch.float32, device=x2.device)
    per_vec = 16 // x2.element_size()  # elements per 16-byte vector
    kernel(blocks, threads, dy2, x2, weight, mean, rstd, dx, partial[0], partial[1], M, N, vecs,
           dy2.stride(0) // per_vec, x2.stride(0) // per_vec, vecs)
    return partial


class LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = layer_norm_forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(dy, x, weight, mean, rstd)
        return dx, dw, db, None


_layer_norm_apply = compat.autograd_apply(LayerNorm)  # LayerNorm.apply without the Python wrapper's per-call checks


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Layer norm over the last dim of x, differentiable in x, weight and bias.

    x, weight and bias share one dtype (fp32, fp16 or bf16); statistics and math are fp32.
    The last dim may be at most MAX_COLS long. Rows are read through their stride; a copy is
    made only when the last dim is not contiguous.
    """
    check_inputs("layer_norm", x=x, weight=weight, bias=bias)
    if x.dim() == 0:
        raise ValueError("layer_norm: x must have at least one dimension; got a 0-d tensor.")
    N = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t.dim() != 1 or t.shape[0] != N:  # (ints, not t.shape != (N,): a Size compare costs microseconds)
            raise ValueError(f"layer_norm: {name} must have shape (x.shape[-1],) = ({N},); got {tuple(t.shape)} "
                             f"for x of shape {tuple(x.shape)}.")
    if N > MAX_COLS:
        raise ValueError(f"layer_norm: rows of {N} elements are longer than this kernel's limit of {MAX_COLS}; "
                         f"use torch.nn.functional.layer_norm for them.")
    weight, bias = weight.contiguous(), bias.contiguous()
    if builds_graph(x, weight, bias):
        return _layer_norm_apply(x, weight, bias, float(eps))
    return layer_norm_forward(x, weight, bias, float(eps), stats=False)[0]  # no graph to record: no Function
