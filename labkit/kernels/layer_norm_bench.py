"""`labkit bench`'s layer norm cases (forward, backward alone, forward+backward through autograd), beside
eager, torch.compile, Liger-Kernel and quack (see labkit/kernels/_bench.py); kept apart from layer_norm.py,
which holds the kernels."""
from __future__ import annotations

import torch

from labkit.kernels._bench import (BenchCase, Timed, autograd_floor, bind, grad_fn, maybe_compile, peer, randn,
                                   rows_cols)
from labkit.kernels.layer_norm import layer_norm, min_bytes, reference


def _bench(dims: tuple[int, ...], dtype: torch.dtype, use_compile: bool) -> Timed:
    M, N = rows_cols(dims)
    x, w, b = randn(M, N, dtype=dtype), randn(N, dtype=dtype), randn(N, dtype=dtype)
    return Timed(f"{M}x{N}", lambda: layer_norm(x, w, b),
                 {"eager": lambda: reference(x, w, b),
                  "compile": bind(maybe_compile(reference, use_compile), x, w, b),
                  "liger": bind(peer("layer_norm"), x, w, b), "quack": bind(peer("layer_norm", "quack"), x, w, b)},
                 min_bytes((M, N), dtype))


def _grad_inputs(dims: tuple[int, ...], dtype: torch.dtype) -> tuple:
    """(M, N, x, w, b, dy) for a backward benchmark: x, w, b require grad."""
    M, N = rows_cols(dims)
    x, w, b = (randn(M, N, dtype=dtype), randn(N, dtype=dtype), randn(N, dtype=dtype))
    return (M, N, *(t.requires_grad_(True) for t in (x, w, b)), randn(M, N, dtype=dtype))


def _bench_fb(dims: tuple[int, ...], dtype: torch.dtype, use_compile: bool) -> Timed:
    M, N, x, w, b, dy = _grad_inputs(dims, dtype)

    def fb(fn):  # forward and backward through autograd, as in training
        return (lambda: torch.autograd.grad(fn(x, w, b), (x, w, b), dy)) if fn is not None else None
    return Timed(f"{M}x{N}", fb(layer_norm),
                 {"eager": fb(reference), "compile": fb(maybe_compile(reference, use_compile)),
                  "liger": fb(peer("layer_norm"))},
                 min_bytes((M, N), dtype) + min_bytes((M, N), dtype, backward=True),
                 host_only={"floor": autograd_floor((x, w, b), dy)})


def _bench_bwd(dims: tuple[int, ...], dtype: torch.dtype, use_compile: bool) -> Timed:
    M, N, x, w, b, dy = _grad_inputs(dims, dtype)
    return Timed(f"{M}x{N}", grad_fn(layer_norm, (x, w, b), dy),
                 {"eager": grad_fn(reference, (x, w, b), dy),
                  "compile": grad_fn(maybe_compile(reference, use_compile), (x, w, b), dy),
                  "liger": grad_fn(peer("layer_norm"), (x, w, b), dy)},
                 min_bytes((M, N), dtype, backward=True),
                 host_only={"floor": autograd_floor((x, w, b), dy, backward_only=True)})


def bench_cases() -> list[BenchCase]:
    sizes = dict(gpu_sizes=("65536x1024", "16384x4096", "8192x8192"), cpu_sizes=("17x129",))
    # issue 39's four shapes (32768x1024, 16384x4096, 8192x8192, 4096x16384) and the ones timed before
    fwd = dict(gpu_sizes=("32768x1024", "65536x1024", "16384x4096", "8192x8192", "4096x16384"), cpu_sizes=("17x129",))
    fb = dict(gpu_sizes=("32768x1024", "65536x1024", "16384x2048", "16384x4096", "8192x8192", "4096x16384"),
              cpu_sizes=("17x129",))
    peers = ("eager", "compile", "liger")
    return [BenchCase("layer_norm", _bench, **fwd, baselines=(*peers, "quack")),
            BenchCase("layer_norm_bwd", _bench_bwd, **sizes, baselines=peers),
            BenchCase("layer_norm_fb", _bench_fb, **fb, baselines=peers)]
