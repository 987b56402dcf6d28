"""AdamW, one fused multi-tensor Triton kernel per step (per parameter group and dtype).

Two variants for fp16/bf16 parameters: master_weights=True (the default, mixed-precision training
as in Apex/DeepSpeed: fp32 master copy and fp32 moments) or master_weights=False (moments in the
parameter's dtype, no master: what torch.optim.AdamW(fused=True) does, 14 bytes per element).

Per parameter element, an AdamW step must read the gradient, the parameter (its fp32 master
copy for fp16/bf16 parameters) and the two moments, and write back the parameter and the moments:
fp32 params: read p, g, m, v + write p, m, v = 7 * 4 = 28 bytes per element.
16-bit params: read g (2), master (4), m (4), v (4) + write p (2), master (4), m (4), v (4) = 28 bytes.
FLOPs: about 15 per element. Memory-bound; the difference between implementations is how many
kernel launches (and passes over memory) they need for many tensors.

Multi-tensor: the step packs each tensor's pointers and size into a small int64 table on the
device, plus a table of (tensor, chunk start) pairs; one launch covers every chunk of every tensor.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable

import torch
import triton
import triton.language as tl

from labkit.kernels._common import FLOAT_DTYPES, INTERPRETED, Launcher, check_tensor

# Each program updates CHUNK elements of one tensor, BLOCK at a time, with NUM_WARPS warps (both
# doubled for 16-bit moments); swept on an H200 (200 x 1M and 8 x 16M parameters, fp32 and bf16).
BLOCK = 256 if INTERPRETED else 512
CHUNK = 256 if INTERPRETED else 8192
NUM_WARPS = 4
_DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_TABLE_COLS = 6  # master-or-param, grad, exp_avg, exp_avg_sq, 16-bit param (or 0), numel


def min_bytes(numel: int, dtype: torch.dtype = torch.float32, master_weights: bool = True) -> int:
    """Bytes one AdamW step must move for `numel` parameters of `dtype` (28 per element, see above;
    7 * element_size for 16-bit parameters without master weights)."""
    return (28 if master_weights else 7 * dtype.itemsize) * numel  # fp32: 7 * 4 = 28 either way


def flops(numel: int) -> int:
    return 15 * numel


def reference(params: Iterable[torch.nn.Parameter], **kwargs) -> torch.optim.Optimizer:
    """The optimizer this one matches: torch.optim.AdamW with its single-tensor loop."""
    return torch.optim.AdamW(params, foreach=False, **kwargs)


@triton.jit
def _typed(addr, CODE: tl.constexpr):
    if CODE == 1:
        return addr.to(tl.pointer_type(tl.float16))
    elif CODE == 2:
        return addr.to(tl.pointer_type(tl.bfloat16))
    else:
        return addr.to(tl.pointer_type(tl.float32))


@triton.jit
def adamw_kernel(table_ptr, chunks_ptr, beta1, beta2, eps, decay, step_size, bc2_sqrt,
                 CODE: tl.constexpr, STATE: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    # CODE: the gradient's dtype; STATE: the dtype of the updated parameter (or master) and moments.
    # Which tensor and which CHUNK of it this program updates.
    pid = tl.program_id(0)
    t = tl.load(chunks_ptr + 2 * pid)
    start = tl.load(chunks_ptr + 2 * pid + 1)
    row = table_ptr + t * 6
    p_ptr = _typed(tl.load(row + 0), STATE)  # the parameter itself, or its fp32 master copy
    g_ptr = _typed(tl.load(row + 1), CODE)
    m_ptr = _typed(tl.load(row + 2), STATE)
    v_ptr = _typed(tl.load(row + 3), STATE)
    n = tl.load(row + 5)
    for i in range(0, CHUNK, BLOCK):
        offs = start + i + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        p = p * decay  # decoupled weight decay: p *= 1 - lr * weight_decay
        m = m + (1.0 - beta1) * (g - m)  # exp_avg.lerp_(grad, 1 - beta1)
        v = v * beta2 + (1.0 - beta2) * g * g
        denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
        p = p - tl.div_rn(step_size * m, denom)
        tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)
        tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty), mask=mask)
        tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty), mask=mask)
        if CODE != STATE:  # 16-bit parameters with a master: write the rounded master copy back
            out_ptr = _typed(tl.load(row + 4), CODE)
            tl.store(out_ptr + offs, p.to(out_ptr.dtype.element_ty), mask=mask)


_adamw = Launcher(adamw_kernel)


class TritonAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, bias correction) with a fused multi-tensor Triton kernel.

    Matches torch.optim.AdamW(foreach=False) step for step on fp32 parameters. Math is fp32.
    master_weights=True: fp16/bf16 parameters get fp32 moments and an fp32 master copy in
    state["master"], updated and rounded back into the parameter each step (so change such a
    parameter only through the optimizer, or reload its state). master_weights=False: moments in
    the parameter's dtype and no master, as torch.optim.AdamW(fused=True) keeps them.
    maximize and amsgrad are not supported.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, master_weights: bool = True, maximize: bool = False,
                 amsgrad: bool = False):
        if maximize or amsgrad:
            raise NotImplementedError("TritonAdamW supports neither maximize nor amsgrad: use torch.optim.AdamW "
                                      "for those.")
        if isinstance(lr, torch.Tensor) or not 0.0 <= lr:
            raise ValueError(f"TritonAdamW: lr must be a float >= 0, got {lr!r}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"TritonAdamW: betas must lie in [0, 1), got {betas!r}")
        if not 0.0 <= eps:
            raise ValueError(f"TritonAdamW: eps must be >= 0, got {eps!r}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"TritonAdamW: weight_decay must be >= 0, got {weight_decay!r}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.master_weights = bool(master_weights)
        self._chunk_tables: dict[tuple, torch.Tensor] = {}
        self._ptr_tables: dict[tuple, tuple[list[int], torch.Tensor]] = {}

    def _init_state(self, p: torch.Tensor) -> dict:
        """Check a parameter the first time it has a gradient and create its state."""
        check_tensor("TritonAdamW", "a parameter", p, FLOAT_DTYPES)
        if not p.is_contiguous():
            raise ValueError("TritonAdamW: parameters must be contiguous (make them so before creating "
                             "the optimizer, e.g. torch.nn.Parameter(t.contiguous())).")
        state = self.state[p]
        state["step"] = 0.0  # a Python number: a CPU tensor per parameter would cost microseconds per step
        dtype = torch.float32 if self.master_weights else p.dtype
        state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)
        state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)
        if p.dtype != torch.float32 and self.master_weights:
            state["master"] = p.detach().to(torch.float32, memory_format=torch.contiguous_format, copy=True)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Host work per parameter is kept to a few dictionary look-ups: with hundreds of tensors,
        # per-parameter tensor operations on the CPU would take longer than the kernel itself.
        for gi, group in enumerate(self.param_groups):
            buckets: dict[tuple, list[torch.Tensor]] = defaultdict(list)
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state = self._init_state(p)
                if grad.dtype != p.dtype or grad.device != p.device or grad.is_sparse:
                    raise TypeError(f"TritonAdamW: a gradient ({grad.dtype}, {grad.device}"
                                    f"{', sparse' if grad.is_sparse else ''}) does not match its parameter "
                                    f"({p.dtype}, {p.device}); sparse gradients need torch.optim.SparseAdam.")
                state["step"] = step = float(state["step"]) + 1.0
                buckets[(p.device, p.dtype, step)].append(p)
            for (device, dtype, step), params in buckets.items():
                self._launch(gi, group, device, dtype, step, params)
        return loss

    def _launch(self, gi: int, group: dict, device: torch.device, dtype: torch.dtype, step: float,
                params: list[torch.Tensor]) -> None:
        beta1, beta2 = group["betas"]
        lr, wd = float(group["lr"]), float(group["weight_decay"])
        # Pointer table (rebuilt when any tensor moved, e.g. gradients freshly allocated).
        ptrs: list[int] = []
        keep = []  # contiguous copies of strided gradients must outlive the launch
        for p in params:
            st = self.state[p]
            grad = p.grad if p.grad.is_contiguous() else p.grad.contiguous()
            keep.append(grad)
            main = st.get("master", p)
            ptrs += [main.data_ptr(), grad.data_ptr(), st["exp_avg"].data_ptr(), st["exp_avg_sq"].data_ptr(),
                     p.data_ptr() if "master" in st else 0, p.numel()]
        key = (gi, device, dtype, step)
        cached = self._ptr_tables.get(key[:3])
        if cached is not None and cached[0] == ptrs:
            table = cached[1]
        else:
            table = torch.tensor(ptrs, dtype=torch.int64).to(device)
            self._ptr_tables[key[:3]] = (ptrs, table)
        # Chunk table: depends on the sizes only, so it is built once.
        sizes = tuple(p.numel() for p in params)
        ckey = (device, sizes)
        chunks = self._chunk_tables.get(ckey)
        if chunks is None:
            pairs = [v for t, n in enumerate(sizes) for start in range(0, n, CHUNK) for v in (t, start)]
            chunks = torch.tensor(pairs, dtype=torch.int64).to(device)
            self._chunk_tables[ckey] = chunks
        n_chunks = chunks.numel() // 2
        if n_chunks == 0:
            return
        bc1 = 1.0 - beta1 ** step
        bc2 = 1.0 - beta2 ** step
        # 16-bit moments move half the bytes per element: twice the block (and warps) keeps as many in flight.
        state16 = not self.master_weights and dtype != torch.float32
        _adamw.launch((n_chunks,), (table, chunks, beta1, beta2, group["eps"], 1.0 - lr * wd, lr / bc1, math.sqrt(bc2)),
                      dict(CODE=_DTYPE_CODE[dtype], STATE=_DTYPE_CODE[dtype] if state16 else 0,
                           BLOCK=BLOCK * (1 + state16), CHUNK=CHUNK,
                           num_warps=1 if INTERPRETED else NUM_WARPS * (1 + state16)))
        del keep  # freed memory is reused only by work queued after this kernel on the stream


# ---- labkit bench: the cases `labkit bench` times (see labkit/kernels/_bench.py)
from labkit.kernels._bench import BenchCase, Timed, randn, rows_cols  # noqa: E402


def _bench(dims: tuple[int, ...], dtype: torch.dtype, use_compile: bool) -> Timed:
    T, n = rows_cols(dims)

    def params():
        ps = [torch.nn.Parameter(randn(n, dtype=dtype)) for _ in range(T)]
        for p in ps:
            p.grad = torch.randn_like(p)
        return ps

    # Like for like: the moments in the parameter's dtype, as torch's fused and foreach AdamW keep them.
    opt = TritonAdamW(params(), master_weights=False)
    foreach = torch.optim.AdamW(params(), foreach=True)
    try:
        fused = torch.optim.AdamW(params(), fused=True)
    except (RuntimeError, ValueError):
        fused = None  # fused AdamW is not available for this device/dtype
    return Timed(f"{T}x{n}", opt.step, {"foreach": foreach.step, "fused": fused.step if fused else None},
                 min_bytes(T * n, dtype, master_weights=False))


def bench_cases() -> list[BenchCase]:
    return [BenchCase("adam", _bench, gpu_sizes=("200x1048576", "8x16777216"), cpu_sizes=("2x500",),
                      baselines=("foreach", "fused"))]
