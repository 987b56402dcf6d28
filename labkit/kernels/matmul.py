"""C = A @ B for 2-D A (M x K) and B (K x N), tiled, with fp32 accumulation.

Bytes (at least, each matrix once): (M*K + K*N + M*N) * element_size.
FLOPs: 2 * M * N * K (a multiply and an add per term).
Compute-bound for large square sizes: arithmetic intensity ~ n/3 FLOP per byte in fp16/bf16.
The tile sizes are chosen by @triton.autotune among configs suited to H100/H200-class GPUs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkit.device import current
from labkit.kernels._common import (FLOAT_DTYPES, INTERPRETED, Launcher, builds_graph, check_same_device,
                                    check_same_dtype, check_tensor)


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


@triton.autotune(configs=configs(), key=["M", "N", "K", "INPUT_PRECISION"],
                 prune_configs_by={"early_config_prune": prune})
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # Program -> output tile, grouped ("swizzled"): GROUP_M tile rows are walked column by column,
    # so programs running at the same time share A rows and B columns in the L2 cache.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

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


def input_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision: fp32 follows torch.backends.cuda.matmul.allow_tf32 like torch.matmul."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"  # (ignored for fp16/bf16 inputs, which the tensor cores take as they are)


# TF32 on Hopper: the tensor cores (wgmma) take 32-bit operands only K-major, so a row-major B is
# copied K-major first (2 K N 4 bytes: a few % of a 4096 product's time) when TF32_B_K_MAJOR is set.
TF32_B_K_MAJOR = True
_launch = Launcher(matmul_kernel.fn)
_tuned: dict = {}  # launch key -> (grid, constexprs, options) of the autotuned config


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D tensors of one dtype (fp32, fp16, bf16); the result has that dtype.

    Accumulates in fp32. fp32 inputs use TF32 tensor cores when
    torch.backends.cuda.matmul.allow_tf32 is True (as torch.matmul does), else full fp32.
    Any strides work (a transposed view needs no copy).
    Differentiable: when a or b requires grad, the backward runs this kernel again
    (da = dc @ b^T, db = a^T @ dc).
    """
    if builds_graph(a, b):
        return _Matmul.apply(a, b)
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


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_tensor("matmul", "a", a, FLOAT_DTYPES)
    check_tensor("matmul", "b", b, FLOAT_DTYPES)
    check_same_device("matmul", a=a, b=b)
    check_same_dtype("matmul", a=a, b=b)
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
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    precision = input_precision(a.dtype)
    if precision == "tf32" and a.dtype == torch.float32 and TF32_B_K_MAJOR and b.stride(0) != 1 and not INTERPRETED:
        b = b.t().contiguous().t()
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    upcast = INTERPRETED and a.dtype != torch.float32
    if INTERPRETED:
        matmul_kernel[_grid(M, N)](*args, INPUT_PRECISION=precision, UPCAST=upcast)
        return c
    # After the first call of a shape has autotuned, later calls launch the chosen binary directly.
    key = (a.dtype, precision, *args[3:])
    tuned = _tuned.get(key)
    if tuned is None:
        matmul_kernel[_grid(M, N)](*args, INPUT_PRECISION=precision, UPCAST=upcast)
        best = matmul_kernel.best_config
        meta = {**best.kwargs, "INPUT_PRECISION": precision, "UPCAST": upcast}
        _tuned[key] = (_grid(M, N)(meta), meta, dict(num_warps=best.num_warps, num_stages=best.num_stages))
        return c
    grid, meta, options = tuned
    _launch(grid, args, meta, **options)
    return c


def _grid(M: int, N: int):
    return lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)


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
