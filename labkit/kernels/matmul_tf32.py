"""C = A @ B in TF32 on Hopper, reading B as it is stored (row-major), written in Gluon.

Bytes (at least): (M*K + K*N + M*N) * 4. FLOPs: 2 * M * N * K (see labkit.kernels.matmul).
Hopper's tensor-core instruction (wgmma) reads 32-bit operands from shared memory only K-major. A (M x K,
row-major) is; B (K x N, row-major) is not, so matmul's TMA kernel first copies B transposed (2 K N 4 bytes).
This kernel needs no copy: each program computes its tile of C^T = B^T A^T. wgmma's first operand may come
from registers, where any layout can be loaded, so B^T is read there from B's shared-memory tile; the second
operand, A^T, is K-major in shared memory as TMA put A there. The epilogue transposes the accumulator in
registers (a relabelling) and stores C by TMA. Gluon is Triton's lower-level language: layouts, shared
memory, barriers and wgmma are written out. It runs only on a GPU (no interpreter); matmul.plan() says when.
"""
from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from labkit.kernels._common import Launcher, cdiv

# Names that changed between Triton releases (later ones: the first; 3.6: the second).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_block_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


@gluon.constexpr_function
def _acc_layout(BM, BN, num_warps):
    """The accumulator (a tile of C^T, BN x BM) in wgmma's layout: warpgroups of 4 warps stacked along its
    BN rows (64 rows each), each instruction BM wide (at most 256) and 8 deep (TF32)."""
    warps = [4, 1]
    while warps[0] * warps[1] != num_warps:
        if BN > 16 * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=warps, instr_shape=[16, BM // warps[1], 8])


@gluon.jit
def _tile_start(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """Tile number -> its first row and column of C, GROUP_M tile rows at a time (as matmul_kernel)."""
    num_in_group = GROUP_M * num_pid_n
    first_m = (tile // num_in_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    return (first_m + (tile % num_in_group) % group_rows) * BM, ((tile % num_in_group) // group_rows) * BN


@gluon.jit
def _load_step(a_desc, b_desc, a_bufs, b_bufs, ready, i, off_m, off_n, pred, STAGES: gl.constexpr):
    """Start the TMA copies of k-step i (A and B tiles) into stage i % STAGES, counted by its mbarrier."""
    s = i % STAGES
    BK: gl.constexpr = a_desc.block_type.shape[1]
    mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    _tma_load(a_desc, [off_m, i * BK], ready.index(s), a_bufs.index(s), pred)
    _tma_load(b_desc, [i * BK, off_n], ready.index(s), b_bufs.index(s), pred)


@gluon.jit
def _mma_step(a_bufs, b_bufs, ready, acc, i, bt_layout: gl.constexpr, STAGES: gl.constexpr):
    """acc (C^T) += B^T A^T for k-step i; returns with this step's wgmma in flight and step i-1's retired."""
    s = i % STAGES
    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
    bt = b_bufs.index(s).permute((1, 0)).load(bt_layout)  # B^T (BN x BK) into registers
    acc = warpgroup_mma(bt, a_bufs.index(s).permute((1, 0)), acc, is_async=True)  # A^T: K-major view
    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    # Both warpgroups read every A tile: all must be past step i-1 before its stage is refilled.
    _block_barrier()
    return acc


@gluon.jit
def matmul_tf32_kernel(a_desc, b_desc, c_desc, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    # a_desc: TMA descriptor over A (M, K), blocks (BM, BK); b_desc: over B (K, N), blocks (BK, BN), N-major;
    # c_desc: over C (M, N), blocks (BM, BN). TMA zero-fills loads past an edge (a K tail adds nothing) and
    # clips stores there. One program per tile of C; STAGES k-steps of A and B tiles in flight.
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    M = a_desc.shape[0]
    K = a_desc.shape[1]
    N = b_desc.shape[1]
    off_m, off_n = _tile_start(gl.program_id(0), gl.cdiv(M, BM), gl.cdiv(N, BN), GROUP_M, BM, BN)
    acc_layout: gl.constexpr = _acc_layout(BM, BN, gl.num_warps())
    bt_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=1)

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BK, BN], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    k_steps = gl.cdiv(K, BK)
    for first in gl.static_range(STAGES - 1):
        _load_step(a_desc, b_desc, a_bufs, b_bufs, ready, first, off_m, off_n, first < k_steps, STAGES)

    acc = gl.zeros([BN, BM], gl.float32, acc_layout)
    # Two k-steps a trip: consecutive steps then load B^T into different registers. With one, the next
    # step's loads would overwrite registers the wgmma in flight still reads, and ptxas serialises them.
    for pair in range(k_steps // 2):
        for j in gl.static_range(2):
            i = 2 * pair + j
            acc = _mma_step(a_bufs, b_bufs, ready, acc, i, bt_layout, STAGES)
            nxt = i + STAGES - 1  # into the stage step i-1 read, now free
            _load_step(a_desc, b_desc, a_bufs, b_bufs, ready, nxt, off_m, off_n, nxt < k_steps, STAGES)
    if k_steps % 2 == 1:
        acc = _mma_step(a_bufs, b_bufs, ready, acc, k_steps - 1, bt_layout, STAGES)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _block_barrier()  # every wgmma has read its stages: C's tile may take their shared memory
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))

    c_smem = gl.allocate_shared_memory(c_desc.dtype, [BM, BN], c_desc.layout)
    c_smem.store(gl.permute(acc, (1, 0)))  # C^T -> C: a relabelling of registers
    fence_async_shared()
    _tma_store(c_desc, [off_m, off_n], c_smem)
    tma.store_wait(pendings=0)


# Tiles (BM, BN, BK, stages, warps, GROUP_M) by problem size n (as matmul's TMA_CONFIGS), the fastest in sweeps
# on an H200: BM 256 makes each wgmma 256 wide, so a B^T fragment loaded into registers feeds twice the work.
CONFIGS = {2048: (256, 128, 32, 4, 8, 8), 4096: (256, 128, 32, 3, 8, 8), 8192: (256, 128, 32, 3, 8, 8)}


@functools.cache
def _shared_layout(rows: int, cols: int) -> gl.NVMMASharedLayout:
    """How TMA lays out an fp32 tile in shared memory (swizzled for wgmma); made once per shape: 5 us a call."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.float32)


_launch = Launcher(matmul_tf32_kernel)


def matmul_tf32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, size: int) -> None:
    """c = a @ b in TF32 for fp32 a (M, K) and b (K, N), both with unit last stride and 16-byte aligned rows,
    and c (M, N) contiguous; `size` picks the tiles (2048, 4096 or 8192)."""
    bm, bn, bk, stages, warps, group = CONFIGS[size]
    descs = (TensorDescriptor.from_tensor(a, [bm, bk], _shared_layout(bm, bk)),
             TensorDescriptor.from_tensor(b, [bk, bn], _shared_layout(bk, bn)),
             TensorDescriptor.from_tensor(c, [bm, bn], _shared_layout(bm, bn)))
    tiles = cdiv(a.shape[0], bm) * cdiv(b.shape[1], bn)
    _launch((tiles,), descs, {"GROUP_M": group, "STAGES": stages}, num_warps=warps)
