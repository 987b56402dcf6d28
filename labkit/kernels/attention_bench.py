"""Attention's benchmark: labkit's kernel against each of SDPA's backends (flash, efficient, cudnn, math), naive
eager attention and torch.compile of it, forward and backward, with and without the causal mask.

`bench_cases()` is what `labkit bench attention` runs; `bench_case(...)` and `sdpa_with(...)` are the harness
notebook 09 times with.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from labkit import compat
from labkit.kernels._bench import BenchCase, Timed, grad_fn, maybe_compile
from labkit.kernels.attention import attention, flops, min_bytes, naive


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}
BASELINES = tuple(SDPA_BACKENDS) + ("naive", "compile")


def sdpa_with(backend: str):
    """scaled_dot_product_attention restricted to one backend (flash, efficient, cudnn or math)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = getattr(SDPBackend, SDPA_BACKENDS[backend])

    def run(q, k, v, causal=False):
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def parse_size(size: str) -> tuple[int, int, int, int]:
    """'4x16x4096x128' -> (B, H, N, d); 'N' alone means 1 x 1 x N x 64."""
    dims = [int(x) for x in size.lower().split("x")]
    if len(dims) == 1:
        return 1, 1, dims[0], 64
    if len(dims) != 4 or min(dims) <= 0:
        raise ValueError(f"attention size {size!r}: write it as BxHxNxD (e.g. 4x16x4096x128)")
    return tuple(dims)  # type: ignore[return-value]


def bench_case(size: str, dtype: torch.dtype = torch.bfloat16, causal: bool = False, backward: bool = False,
               use_compile: bool = True, device: torch.device | str | None = None) -> dict:
    """One benchmark: {shape, fn (labkit), baselines {name: fn or None}, flops, bytes} for `size` = BxHxNxD.

    Each baseline runs once here; one that cannot run on this machine (a backend missing, out of memory)
    is None. Backward cases time the backward alone (the forward graph is kept: retain_graph).
    """
    from labkit.device import current

    dev = torch.device(device) if device is not None else current().device
    B, H, N, D = parse_size(size)
    q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=dtype) for _ in range(3))
    fns = {"labkit": lambda q, k, v: attention(q, k, v, causal=causal)}
    for name in SDPA_BACKENDS:
        fns[name] = (lambda run: lambda q, k, v: run(q, k, v, causal))(sdpa_with(name))
    fns["naive"] = lambda q, k, v: naive(q, k, v, causal)
    if use_compile:
        compat.reset_compiled()  # each case is a new shape: start clean rather than hit the recompile limit
    compiled = maybe_compile(naive, use_compile, dynamic=False)  # (its backward may keep its graph: grad_fn)
    fns["compile"] = (lambda q, k, v: compiled(q, k, v, causal)) if compiled is not None else None
    calls: dict[str, object] = {}
    for name, fn in fns.items():
        if fn is None:
            calls[name] = None
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                calls[name] = _grad_call(fn, q, k, v) if backward else (lambda fn=fn: fn(q, k, v))
                if not backward:
                    calls[name]()
        except (RuntimeError, NotImplementedError, ValueError):  # a backend missing here, or out of memory
            if name == "labkit":
                raise
            calls[name] = None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return {"shape": f"{B}x{H}x{N}x{D}{' causal' if causal else ''}", "fn": calls.pop("labkit"),
            "baselines": calls, "flops": flops(B, H, N, D, causal, backward),
            "bytes": min_bytes(B, H, N, D, dtype, backward)}


def _grad_call(fn, q, k, v):
    """A call of the backward alone (see _bench.grad_fn: the forward is built at its first call, on the
    stream that times it), run once here so that a backend which cannot run fails now."""
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    do = torch.randn_like(q)
    torch.autograd.grad(fn(qg, kg, vg), (qg, kg, vg), do)
    return grad_fn(fn, (qg, kg, vg), do)




def _bench(causal: bool, backward: bool):
    def make(dims: tuple[int, ...], dtype: torch.dtype, use_compile: bool) -> Timed:
        c = bench_case("x".join(map(str, dims)), dtype, causal=causal, backward=backward, use_compile=use_compile)
        return Timed(c["shape"], c["fn"], c["baselines"], c["flops"])
    return make


def bench_cases() -> list[BenchCase]:
    """Forward and backward, causal or not (sizes BxHxNxD), against each SDPA backend, naive attention and
    torch.compile of it. `labkit bench attention` runs all four."""
    common = dict(gpu_sizes=("4x16x1024x128", "4x16x4096x128", "1x16x16384x128"), cpu_sizes=("1x2x37x64",),
                  baselines=("flash", "efficient", "cudnn", "math", "naive", "compile"), unit="TFLOP/s",
                  gpu_dtypes=("bf16",), cpu_dtypes=("bf16",))  # the kernel takes fp16/bf16 only
    return [BenchCase(f"attention{'_causal' if causal else ''}_{'bwd' if backward else 'fwd'}",
                      _bench(causal, backward), **common)
            for backward in (False, True) for causal in (False, True)]
