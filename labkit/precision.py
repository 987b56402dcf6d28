"""Matmul in fp32, TF32, fp16 and bf16: each one's rate and its error against an fp64 reference.

An n x n x n matmul does 2 n^3 FLOPs and must move at least 3 n^2 elements (read A and B, write
C): 12 n^2 bytes in fp32/TF32, 6 n^2 in fp16/bf16. TF32 is not a storage type: it is fp32 in
memory, rounded to a 10-bit mantissa inside the tensor cores (a CUDA setting, off by default).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from labkit.device import current
from labkit.timing import Timing, bench, tflops

PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "tf32": torch.float32,
                                      "fp16": torch.float16, "bf16": torch.bfloat16}


def _check_precision(precision: str) -> torch.dtype:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {sorted(PRECISIONS)}: "
                         f"pick one of those names (TF32 is asked for as 'tf32').")
    return PRECISIONS[precision]


def _check_size(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"matrix size must be a positive int, got {n!r}")


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """Let (or forbid) CUDA fp32 matmuls use TF32 tensor cores inside the block; restores the setting."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = bool(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def supported(precision: str, device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether this precision's matmul is meaningful on `device`, and why not when it is not."""
    _check_precision(precision)
    dev = torch.device(device) if device is not None else current().device
    if dev.type == "cuda":
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            return False, "this GPU has no bf16 support (it needs compute capability 8.0 or newer)"
        if precision == "tf32" and torch.cuda.get_device_capability(dev)[0] < 8:
            return False, "TF32 tensor cores need compute capability 8.0 or newer (Ampere)"
        return True, ""
    if precision == "tf32":
        return False, "TF32 is a setting of NVIDIA tensor cores; on the CPU fp32 stands for it"
    if precision == "fp16":
        try:
            a = torch.ones(8, 8, dtype=torch.float16)
            ok = bool(torch.isfinite(a @ a).all())
        except RuntimeError as exc:  # older builds have no fp16 matmul on the CPU
            return False, f"this torch build has no fp16 matmul on the CPU ({exc})"
        if not ok:
            return False, "fp16 matmul on this CPU gave non-finite results"
    return True, ""


def inputs(n: int, device: torch.device | str | None = None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random fp64 matrices A, B (n x n), the reference inputs every precision is rounded from."""
    _check_size(n)
    dev = torch.device(device) if device is not None else current().device
    g = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64, device=dev)
    b = torch.randn(n, n, generator=g, dtype=torch.float64, device=dev)
    return a, b


def matmul_in(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """a @ b computed in `precision` (inputs rounded to it), returned in that precision's dtype."""
    dtype = _check_precision(precision)
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} and b on {b.device}: move both to one device first")
    with tf32(precision == "tf32"):
        return a.to(dtype) @ b.to(dtype)


def relative_error(n: int, precision: str, device: torch.device | str | None = None, seed: int = 0) -> float:
    """||C - C64||_F / ||C64||_F for an n^3 matmul in `precision`, C64 computed in fp64 from the same inputs."""
    return relative_errors(n, [precision], device, seed)[precision]


def relative_errors(n: int, precisions: list[str], device: torch.device | str | None = None,
                    seed: int = 0) -> dict[str, float]:
    """`relative_error` for several precisions sharing one set of inputs and one fp64 product."""
    for p in precisions:
        _check_precision(p)
    a, b = inputs(n, device, seed)
    ref = a @ b
    norm = torch.linalg.vector_norm(ref)
    out = {}
    for p in precisions:
        out[p] = float(torch.linalg.vector_norm(matmul_in(a, b, p).to(torch.float64) - ref) / norm)
    return out


@dataclass(frozen=True)
class MatmulRate:
    n: int
    precision: str
    timing: Timing
    tflops: float


def matmul_rate(n: int, precision: str, device: torch.device | str | None = None, rep_ms: float = 100.0,
                shape: tuple[int, int, int] | None = None) -> MatmulRate:
    """Time an (m x k) @ (k x n) matmul in `precision` (square n^3 unless `shape` = (m, k, n))."""
    dtype = _check_precision(precision)
    m, k, nn = shape if shape is not None else (n, n, n)
    for s in (m, k, nn):
        _check_size(s)
    dev = torch.device(device) if device is not None else current().device
    a = torch.randn(m, k, device=dev, dtype=dtype)
    b = torch.randn(k, nn, device=dev, dtype=dtype)
    with tf32(precision == "tf32"):
        t = bench(lambda: a @ b, rep_ms=rep_ms, device=dev)
    return MatmulRate(n=n, precision=precision, timing=t, tflops=tflops(2 * m * k * nn, t.median_ms))


def unit_roundoff(precision: str) -> float:
    """Half the gap between 1 and the next number: the relative error of rounding one value."""
    _check_precision(precision)
    mantissa_bits = {"fp32": 23, "tf32": 10, "fp16": 10, "bf16": 7}[precision]
    return 2.0 ** -(mantissa_bits + 1)


def format_rows() -> list[dict[str, object]]:
    """Bits, range and precision of each format, from torch.finfo (TF32: fp32's range, fp16's mantissa)."""
    rows = []
    for name, dtype in PRECISIONS.items():
        fi = torch.finfo(dtype)
        mant = {"fp32": 23, "tf32": 10, "fp16": 10, "bf16": 7}[name]
        exp = {"fp32": 8, "tf32": 8, "fp16": 5, "bf16": 8}[name]
        rows.append({"format": name, "storage bits": fi.bits, "exponent bits": exp, "mantissa bits": mant,
                     "max": fi.max, "smallest normal": fi.smallest_normal,
                     "smallest subnormal": fi.smallest_normal * 2.0 ** -mant, "eps": 2.0 ** -mant})
    return rows


def zero_fraction(x: torch.Tensor, reference: torch.Tensor) -> float:
    """Fraction of elements that are exactly zero in `x` but not in `reference` (underflowed)."""
    if x.shape != reference.shape:
        raise ValueError(f"shapes differ: {tuple(x.shape)} vs {tuple(reference.shape)}")
    lost = (x == 0) & (reference != 0)
    return lost.sum().item() / max(1, reference.numel())
