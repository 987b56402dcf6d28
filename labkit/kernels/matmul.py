"""C = A @ B for 2-D A (M x K) and B (K x N), tiled, with fp32 accumulation.

Bytes (at least, each matrix once): (M*K + K*N + M*N) * element_size.
FLOPs: 2 * M * N * K (a multiply and an add per term).
Compute-bound for large square sizes: arithmetic intensity ~ n/3 FLOP per byte in fp16/bf16.
Three kernels: for tensor-core precisions (bf16, fp16, TF32) on Hopper-class GPUs (and in the
interpreter) a TMA kernel whose tiles come from a small table measured on an H200
(`matmul_tma_kernel`); for TF32 with a row-major B on Hopper, a Gluon kernel that needs no copy of B
(labkit/kernels/matmul_tf32.py); for full fp32, older GPUs and inputs TMA cannot describe, a pointer
kernel whose tiles @triton.autotune picks (`matmul_kernel`). `plan(a, b)` says which a call takes.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from labkit import compat
from labkit.device import current
from labkit.kernels._common import INTERPRETED, Launcher, builds_graph, cdiv, check_inputs, num_sms

# Triton >= 3.4: host-side TMA descriptors (the interpreter runs them too); older Triton: the pointer kernel
TensorDescriptor = compat.tensor_descriptor()
# a Triton with Gluon: TF32 with a row-major B on Hopper needs no copy of B (else the TMA kernel, one warning on
# a GPU; the interpreter never takes the Gluon kernel, so it does not warn there)
matmul_tf32 = compat.gluon_matmul(warn=not INTERPRETED)


def min_bytes(M: int, N: int, K: int, dtype: torch.dtype = torch.float32) -> int:
    return (M * K + K * N + M * N) * torch.empty((), dtype=dtype).element_size()


def flops(M: int, N: int, K: int) -> int:
    return 2 * M * N * K


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def _config(bm, bn, bk, stages, warps, group=8):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group},
                         num_stages=stages, num_warps=warps)


def configs() -> list:
    """Autotuning candidates; the interpreter gets one small config (autotuning it would take ages)."""
    if current().triton_interpreter or INTERPRETED:
        return [_config(32, 32, 32, 1, 1, group=4)]
    return [
        _config(128, 256, 32, 3, 8),  # fp32 (TF32): 64-wide K tiles do not fit three stages
        _config(128, 128, 32, 4, 8),
        _config(128, 256, 64, 3, 8),
        _config(256, 128, 64, 3, 8),
        _config(128, 256, 64, 4, 8),
        _config(128, 128, 64, 4, 8),
        _config(128, 128, 64, 4, 4),
        _config(128, 256, 32, 4, 8),
        _config(256, 128, 32, 4, 8),
        _config(128, 128, 32, 5, 4),
        _config(128, 128, 64, 3, 8),  # 2048: 256 tiles keep 132 SMs busy where 128x256 gives 128
        _config(64, 256, 64, 4, 8),
        _config(64, 128, 64, 4, 4),  # small or skinny problems
    ]


SMEM_BYTES = 220 * 1024  # shared memory per block on H100/H200 (227 KiB), less a margin


def prune(configs: list, named_args: dict, **kwargs) -> list:
    """Drop configs whose pipelined tiles overflow shared memory; small problems try only two."""
    elem = named_args["a_ptr"].element_size()
    fits = [c for c in configs if (c.kwargs["BLOCK_M"] + c.kwargs["BLOCK_N"]) * c.kwargs["BLOCK_K"] * elem
            * max(1, c.num_stages) <= SMEM_BYTES] or configs[-1:]
    if named_args["M"] * named_args["N"] * named_args["K"] < 1024**3 and len(fits) > 2:
        small = [c for c in fits if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 128 * 128]
        fits = small[-2:] or fits[-2:]
    return fits


@triton.jit
def _pid(tile_id, num_pid_in_group, num_pid_m, GROUP_M: tl.constexpr):
    """Tile number -> (tile row, tile column), GROUP_M tile rows at a time (see matmul_kernel)."""
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    return first_pid_m + (tile_id % group_size_m), (tile_id % num_pid_in_group) // group_size_m


@triton.autotune(configs=configs(), key=["M", "N", "K", "INPUT_PRECISION"],
                 prune_configs_by={"early_config_prune": prune})
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # Program -> output tile, grouped ("swizzled"): GROUP_M tile rows are walked column by column,
    # so programs running at the same time share A rows and B columns in the L2 cache.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid_m, pid_n = _pid(tl.program_id(0), GROUP_M * tl.cdiv(N, BLOCK_N), num_pid_m, GROUP_M)

    # Rows of A and columns of B this tile needs; indices past the edge wrap around (% M, % N):
    # those rows/columns are computed but never stored, so the loads need no mask.
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_am = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_bn, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        # The last K step may run past K: masked elements load as 0 and add nothing.
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        if UPCAST:  # the interpreter's 16-bit dot is unreliable; fp32 gives the same exact products
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def matmul_tma_kernel(a_desc, b_desc, c_desc, M, N, K,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                      NUM_PROGS: tl.constexpr, B_KMAJOR: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                      FLATTEN: tl.constexpr, UPCAST: tl.constexpr):
    # a_desc: TMA descriptor over A (M, K), blocks (BLOCK_M, BLOCK_K).
    # b_desc: over B (K, N), blocks (BLOCK_K, BLOCK_N); or, when B_KMAJOR, over B^T (N, K), blocks (BLOCK_N, BLOCK_K).
    # c_desc: over C (M, N), blocks (BLOCK_M, BLOCK_N).
    # The TMA unit copies whole tiles between global and shared memory, zero-filling loads past an edge and
    # clipping stores there, so no masks and no pointer arithmetic. Program p does tiles p, p + NUM_PROGS, ...
    # ("persistent" when NUM_PROGS is the SM count; one tile each when NUM_PROGS is past the last tile).
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    num_pid_in_group = GROUP_M * num_pid_n
    tile_c = start - NUM_PROGS  # the tile the epilogue stores (tracked apart: FLATTEN moves the epilogue)
    for tile_id in tl.range(start, num_tiles, NUM_PROGS, flatten=FLATTEN):
        pid_m, pid_n = _pid(tile_id, num_pid_in_group, num_pid_m, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            if B_KMAJOR:
                b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K]).T
            else:
                b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
            if UPCAST:  # the interpreter's 16-bit dot is unreliable; fp32 gives the same exact products
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        tile_c += NUM_PROGS
        pid_m, pid_n = _pid(tile_c, num_pid_in_group, num_pid_m, GROUP_M)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


@triton.jit
def transpose_kernel(x_ptr, y_ptr, R, C, stride_xr, stride_xc, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # x_ptr: X (R, C), any strides; y_ptr: Y = X^T (C, R), contiguous. One program per BLOCK_R x BLOCK_C tile:
    # read along X's rows (coalesced when stride_xc is 1), write along Y's rows (coalesced): tl.trans
    # reshuffles the tile in registers/shared memory, so both sides of the copy move whole cache lines.
    pid = tl.program_id(0)
    tiles_c = tl.cdiv(C, BLOCK_C)
    offs_r = (pid // tiles_c) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = (pid % tiles_c) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r[:, None] < R) & (offs_c[None, :] < C)
    tile = tl.load(x_ptr + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc, mask=mask)
    tl.store(y_ptr + offs_c[:, None] * R + offs_r[None, :], tl.trans(tile), mask=tl.trans(mask))


TRANSPOSE_TILE = (64, 64)  # 16 KiB of fp32 per program


def transpose(x: torch.Tensor) -> torch.Tensor:
    """x.t().contiguous() for a 2-D tensor, in one tiled pass (about copy bandwidth: 2 R C element bytes)."""
    R, C = x.shape
    y = torch.empty(C, R, dtype=x.dtype, device=x.device)
    if R and C:
        br, bc = TRANSPOSE_TILE
        transpose_kernel[(cdiv(R, br) * cdiv(C, bc),)](
            x, y, R, C, x.stride(0), x.stride(1), BLOCK_R=br, BLOCK_C=bc, num_warps=1 if INTERPRETED else 4)
    return y


def input_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision: fp32 follows torch.backends.cuda.matmul.allow_tf32 like torch.matmul."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"  # (ignored for fp16/bf16 inputs, which the tensor cores take as they are)


# TF32 on Hopper: the tensor cores (wgmma) read 32-bit operands from shared memory only K-major. A row-major
# B goes to the Gluon kernel (matmul_tf32.py), which loads B^T into registers instead, when TF32_GLUON is set
# and it can run (a Hopper GPU, a Triton with Gluon). Else a B that is not K-major is copied K-major first by
# transpose() (2 K N 4 bytes: 8% of a 4096 product's time on an H200) when TF32_B_K_MAJOR is set. A K-major B
# (b.stride(0) == 1, e.g. b = t.t()) is used as it is by the TMA kernel, with no copy.
TF32_GLUON = True
TF32_B_K_MAJOR = True

# TMA kernel tiles: (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps, GROUP_M, persistent, flatten), keyed on
# (operand bits, n), n the nearest of 2048/4096/8192 to (M N K)^(1/3): the fastest in sweeps on H200s
# (cuBLAS time / ours: bf16 0.99, 1.01, 1.05; TF32 with B already K-major 0.92-0.95, 0.92-0.94, 0.92-1.02,
# before the K-major copy). fp16 takes bf16's tiles. Full fp32 (allow_tf32 off, no tensor cores) stays on
# the pointer kernel. The shared memory a config needs, num_stages * (BLOCK_M + BLOCK_N) * BLOCK_K * element
# bytes, stays under 227 KiB.
TMA_CONFIGS = {
    (16, 2048): (128, 256, 64, 3, 8, 8, True, True),
    (16, 4096): (128, 256, 64, 3, 8, 8, True, False),
    (16, 8192): (256, 128, 64, 3, 8, 8, False, False),
    (32, 2048): (128, 128, 32, 5, 8, 8, True, True),
    (32, 4096): (128, 128, 32, 5, 8, 8, True, True),
    (32, 8192): (128, 128, 32, 5, 8, 8, False, False),
}
INTERPRETER_TMA_CONFIG = (32, 32, 32, 1, 1, 4, True, True)  # small tiles: the interpreter is slow per element
# Below this many multiply-adds a GPU keeps the autotuned pointer kernel: the table was measured at
# 2048-8192 only, and its big tiles would leave most SMs idle on a small product. 16-bit products below 4096^3
# keep it too: on an H200 at 2048^3 bf16 its GPU time was within 4% of the TMA kernel's (26.4 against 25.5 us,
# CUDA graph), and its host time 52 against 87 us a call (the TMA launch encodes three tensor maps on the host
# each call), so in eager use it took 28.4 us a call against 43.4 (cuBLAS 29.1); at 3072^3 the two tied on the GPU.
TMA_MIN_MNK = {2: 4096**3, 4: 1024**3}  # by operand bytes
ONE_TILE = 1 << 30  # NUM_PROGS past any tile count: each program does one tile (one binary for every shape)


class Plan(NamedTuple):
    """How _matmul runs one kind of call: which kernel, B's layout, and the launch."""
    path: str  # "tma", "gluon" (TF32, row-major B, Hopper) or "pointer"
    copy_b: bool  # TF32: B is first copied K-major (by transpose() on the TMA path)
    b_kmajor: bool  # TMA: b_desc describes B^T (N, K)
    grid: tuple  # the launch grid (pointer kernel: once its first call has autotuned; empty before)
    meta: dict  # the constexprs, in the kernel's order
    options: dict  # num_warps, num_stages


@functools.cache
def _tma_device(device: torch.device) -> bool:
    if TensorDescriptor is None:
        return False
    return INTERPRETED or torch.cuda.get_device_capability(device) >= (9, 0)


@functools.cache
def _gluon_device(device: torch.device) -> bool:
    """Whether the Gluon TF32 kernel runs here: Hopper's wgmma (sm_90 only), compiled (no interpreter)."""
    return matmul_tf32 is not None and not INTERPRETED and torch.cuda.get_device_capability(device)[0] == 9


def _tma_ok(t: torch.Tensor) -> bool:
    """TMA's rules for a 2-D tensor: base 16-byte aligned, last stride 1, the other a multiple of 16 bytes."""
    return t.stride(1) == 1 and t.stride(0) * t.element_size() % 16 == 0 and t.data_ptr() % 16 == 0


def _plan(a: torch.Tensor, b: torch.Tensor, precision: str) -> Plan:
    M, K = a.shape
    N = b.shape[1]
    elem = a.element_size()
    tf32 = precision == "tf32" and a.dtype == torch.float32
    copy_b = tf32 and TF32_B_K_MAJOR and b.stride(0) != 1
    # A must be row-major (TMA needs a unit last stride, TF32 needs A K-major): a transposed A, as in the
    # backward's a.t() @ dc, takes the pointer kernel. C is allocated (M, N) contiguous: N must suit TMA too.
    # Full fp32 (TF32 off) uses no tensor cores: it keeps the autotuned pointer kernel.
    tma = (_tma_device(a.device) and precision != "ieee" and (INTERPRETED or M * N * K >= TMA_MIN_MNK[elem])
           and _tma_ok(a) and N * elem % 16 == 0)
    n = (M * N * K) ** (1 / 3)
    size = 2048 if n < 2896 else 4096 if n < 5793 else 8192  # 2896, 5793: the geometric midpoints
    if tma and tf32 and TF32_GLUON and b.stride(0) != 1 and _tma_ok(b) and _gluon_device(a.device):
        return Plan("gluon", False, False, (), {"size": size}, {})
    if tma and copy_b:  # transpose() writes B^T (N, K) contiguous
        b_kmajor, tma = True, K * elem % 16 == 0
    elif tma and b.stride(0) == 1 and _tma_ok(b.t()):  # already K-major (e.g. b = t.t()): no copy
        b_kmajor = True
    elif tma and not tf32 and _tma_ok(b):  # row-major B (TF32 only takes it K-major)
        b_kmajor = False
    else:
        tma = False
    if not tma:
        return Plan("pointer", copy_b and not INTERPRETED, False, (), {}, {})
    bm, bn, bk, stages, warps, group, persistent, flatten = (
        INTERPRETER_TMA_CONFIG if INTERPRETED else TMA_CONFIGS[(16 if elem == 2 else 32, size)])
    tiles = cdiv(M, bm) * cdiv(N, bn)
    sms = num_sms(a.device)
    meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group,
            "NUM_PROGS": sms if persistent else ONE_TILE, "B_KMAJOR": b_kmajor, "INPUT_PRECISION": precision,
            "FLATTEN": flatten, "UPCAST": INTERPRETED and elem == 2}
    return Plan("tma", copy_b, b_kmajor, (min(sms, tiles) if persistent else tiles,), meta,
                {"num_warps": warps, "num_stages": stages})


def plan(a: torch.Tensor, b: torch.Tensor) -> Plan:
    """The plan matmul(a, b) follows (which kernel, whether B is copied, the tiles)."""
    return _plan(a, b, input_precision(a.dtype))


_launch = Launcher(matmul_kernel.fn)
_launch_tma = Launcher(matmul_tma_kernel)
_plans: dict = {}  # (dtype, precision, shapes, strides, alignment, device) -> Plan


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D tensors of one dtype (fp32, fp16, bf16); the result has that dtype.

    Accumulates in fp32. fp32 inputs use TF32 tensor cores when
    torch.backends.cuda.matmul.allow_tf32 is True (as torch.matmul does), else full fp32.
    Any strides work; only TF32 may copy B, when it is not K-major and the Gluon kernel cannot take it
    (see TF32_GLUON).
    Differentiable: when a or b requires grad, the backward runs this kernel again
    (da = dc @ b^T, db = a^T @ dc).
    """
    if builds_graph(a, b):
        return _matmul_apply(a, b)
    return _matmul(a, b)


class _Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _matmul(a, b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        dc = dc.to(a.dtype)
        da = _matmul(dc, b.t()) if ctx.needs_input_grad[0] else None
        db = _matmul(a.t(), dc) if ctx.needs_input_grad[1] else None
        return da, db


_matmul_apply = compat.autograd_apply(_Matmul)  # _Matmul.apply without the Python wrapper's per-call checks


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_inputs("matmul", a=a, b=b)  # (tensors of a kind that passed before: one set look-up)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"matmul: a and b must be 2-D; got shapes {tuple(a.shape)} and {tuple(b.shape)} "
                         f"(for batches, loop or use torch.matmul).")
    M, K = a.shape
    if b.shape[0] != K:
        raise ValueError(f"matmul: inner dimensions differ: a is {tuple(a.shape)}, so b must have shape ({K}, N); "
                         f"got {tuple(b.shape)}.")
    N = b.shape[1]
    if max(M * K, K * N, M * N) >= 2**31:
        raise ValueError(f"matmul: ({M} x {K}) @ ({K} x {N}) has a matrix of 2^31 elements or more, beyond this "
                         f"kernel's 32-bit offsets; split the problem into blocks.")
    c = torch.empty(M, N, dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    precision = input_precision(a.dtype)
    plan_key = (a.dtype, precision, TF32_GLUON, TF32_B_K_MAJOR, M, N, K, *a.stride(), *b.stride(),
                a.data_ptr() % 16 == 0, b.data_ptr() % 16 == 0, a.device)
    p = _plans.get(plan_key)
    if p is None:  # decided once per kind of call
        p = _plans[plan_key] = _plan(a, b, precision)
    if p.path == "gluon":
        matmul_tf32.matmul_tf32(a, b, c, p.meta["size"])
        return c
    if p.copy_b:
        b = transpose(b).t()  # K-major: b.t() is contiguous (N, K)
    if p.path == "tma":
        bm, bn, bk = p.meta["BLOCK_M"], p.meta["BLOCK_N"], p.meta["BLOCK_K"]
        b_desc = (TensorDescriptor.from_tensor(b.t(), [bn, bk]) if p.b_kmajor
                  else TensorDescriptor.from_tensor(b, [bk, bn]))
        descs = (TensorDescriptor.from_tensor(a, [bm, bk]), b_desc, TensorDescriptor.from_tensor(c, [bm, bn]))
        _launch_tma(p.grid, (*descs, M, N, K), p.meta, **p.options)
        return c
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    upcast = INTERPRETED and a.dtype != torch.float32
    if INTERPRETED:
        matmul_kernel[_grid(M, N)](*args, INPUT_PRECISION=precision, UPCAST=upcast)
        return c
    # After the first call of a kind has autotuned, its plan keeps the chosen config: later calls launch
    # that binary directly.
    if not p.grid:
        matmul_kernel[_grid(M, N)](*args, INPUT_PRECISION=precision, UPCAST=upcast)
        best = matmul_kernel.best_config
        meta = {**best.kwargs, "INPUT_PRECISION": precision, "UPCAST": upcast}
        _plans[plan_key] = p._replace(grid=_grid(M, N)(meta), meta=meta,
                                      options=dict(num_warps=best.num_warps, num_stages=best.num_stages))
        return c
    _launch(p.grid, args, p.meta, **p.options)
    return c


def _grid(M: int, N: int):
    return lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)


# ---- labkit bench: the cases `labkit bench` times (see labkit/kernels/_bench.py)
from labkit.kernels._bench import BenchCase, Timed, randn  # noqa: E402


def _bench(dims: tuple[int, ...], dtype: torch.dtype, use_compile: bool) -> Timed:
    M, N, K = (dims * 3)[:3] if len(dims) == 1 else (dims + dims[-1:])[:3]
    a, b = randn(M, K, dtype=dtype), randn(K, N, dtype=dtype)
    return Timed(f"{M}x{N}x{K}", lambda: matmul(a, b), {"torch": lambda: torch.matmul(a, b), "compile": None},
                 flops(M, N, K))


def bench_cases() -> list[BenchCase]:
    # 2048 too: at that size the tile choice decides whether all 132 SMs of an H100/H200 are busy
    return [BenchCase("matmul", _bench, gpu_sizes=("2048", "4096", "8192"), cpu_sizes=("64",),
                      baselines=("torch", "compile"), unit="TFLOP/s", gpu_dtypes=("bf16", "fp16", "tf32"))]
