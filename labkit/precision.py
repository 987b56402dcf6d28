"""Matmul in fp32, TF32, fp16 and bf16: each one's rate and its error against an fp64 reference.

An n x n x n matmul does 2 n^3 FLOPs and must move at least 3 n^2 elements (read A and B, write
C): 12 n^2 bytes in fp32/TF32, 6 n^2 in fp16/bf16. TF32 is not a storage type: it is fp32 in
memory, rounded to a 10-bit mantissa inside the tensor cores (a CUDA setting, off by default).
FP8 (e4m3) is a storage type that needs a scale per tensor: `fp8_matmul` multiplies with
`torch._scaled_mm` on GPUs that have FP8 tensor cores (compute capability 8.9+), and emulates
the same rounding in fp64 elsewhere, so its error can be seen on any machine.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator

import torch

from labkit import compat
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


MANTISSA_BITS = {"fp32": 23, "tf32": 10, "fp16": 10, "bf16": 7, "fp8": 3}
# RMS of one round-to-nearest's relative error, in units of u, for values whose mantissas are spread
# log-uniformly (Benford): sqrt(E[1/m^2] / 3) over m in [1, 2) = sqrt((3/8) / ln 2 / 3).
ROUNDING_RMS = math.sqrt(0.375 / math.log(2) / 3)


def unit_roundoff(precision: str) -> float:
    """Half the gap between 1 and the next number: the relative error of rounding one value."""
    if precision != "fp8":
        _check_precision(precision)
    return 2.0 ** -(MANTISSA_BITS[precision] + 1)


def error_model(n: int, precision: str, summation: str | int = "chain") -> float:
    """Expected ||C - C64|| / ||C64|| of an n^3 matmul of random inputs in `precision`.

    Random rounding errors add in quadrature: the two inputs are rounded to the format, the output
    to its storage format (fp16/bf16 store C in 16 bits; TF32 and fp32 return fp32; FP8 returns
    bf16), and the k = n products are summed in fp32. Each addition rounds its partial sum, whose size
    is sqrt(terms under it): the roundings add up to sum(terms under each addition) / k unit roundings.
    `summation`: "chain" (one after another: n / 2), an int b (k-blocks of b terms from zero, then the
    block sums in a chain, as split-k or a BLAS's blocks: (b + n / b) / 2), or "tree" (pairwise, the
    fewest any order can have: log2 n). Each rounding is ROUNDING_RMS x u.
    """
    _check_size(n)
    u_in, u32 = unit_roundoff(precision), unit_roundoff("fp32")
    u_out = {"fp16": u_in, "bf16": u_in, "fp8": unit_roundoff("bf16")}.get(precision, 0.0)
    if summation == "chain" or (isinstance(summation, int) and summation >= n):
        roundings = n / 2
    elif summation == "tree":
        roundings = math.log2(n) if n > 1 else 0.0
    elif isinstance(summation, int) and not isinstance(summation, bool) and summation >= 1:
        roundings = (summation + n / summation) / 2
    else:
        raise ValueError(f"summation={summation!r}: use 'chain', 'tree' or a k-block size (an int >= 1)")
    return ROUNDING_RMS * math.sqrt(2 * u_in**2 + u_out**2 + roundings * u32**2)


def worst_case_bound(n: int) -> float:
    """The classical worst-case relative error of an n-term fp32 dot product: about n x u (Higham's gamma_n)."""
    _check_size(n)
    return n * unit_roundoff("fp32")


def format_rows() -> list[dict[str, object]]:
    """Bits, range and precision of each format, from torch.finfo (TF32: fp32's range, fp16's mantissa)."""
    rows = []
    for name, dtype in PRECISIONS.items():
        fi = torch.finfo(dtype)
        rows.append(_row(name, fi, exp={"fp32": 8, "tf32": 8, "fp16": 5, "bf16": 8}[name],
                         mant=MANTISSA_BITS[name]))
    for name, (dtype, exp, mant) in FP8_FORMATS.items():
        rows.append(_row(name, torch.finfo(dtype), exp, mant))
    return rows


FP8_FORMATS = {"fp8 e4m3": (torch.float8_e4m3fn, 4, 3), "fp8 e5m2": (torch.float8_e5m2, 5, 2)}


def _row(name: str, fi: torch.finfo, exp: int, mant: int) -> dict[str, object]:
    return {"format": name, "storage bits": fi.bits, "exponent bits": exp, "mantissa bits": mant,
            "max": fi.max, "smallest normal": fi.smallest_normal,
            "smallest subnormal": fi.smallest_normal * 2.0 ** -mant, "eps": 2.0 ** -mant}


def zero_fraction(x: torch.Tensor, reference: torch.Tensor) -> float:
    """Fraction of elements that are exactly zero in `x` but not in `reference` (underflowed)."""
    if x.shape != reference.shape:
        raise ValueError(f"shapes differ: {tuple(x.shape)} vs {tuple(reference.shape)}")
    lost = (x == 0) & (reference != 0)
    return lost.sum().item() / max(1, reference.numel())


FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def fp8_supported(device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether `torch._scaled_mm` can run FP8 (e4m3) matmuls on `device`, and why not when it cannot."""
    dev = torch.device(device) if device is not None else current().device
    if dev.type != "cuda":
        return False, "FP8 matmul needs an NVIDIA GPU with FP8 tensor cores (Ada or Hopper, compute capability 8.9+)"
    if torch.cuda.get_device_capability(dev) < (8, 9):
        cc = ".".join(map(str, torch.cuda.get_device_capability(dev)))
        return False, f"this GPU (compute capability {cc}) has no FP8 tensor cores; they start at 8.9 (Ada, Hopper)"
    if compat.scaled_mm() is None:
        return False, f"torch {torch.__version__} has no torch._scaled_mm"
    return True, ""


def to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / scale rounded to e4m3, scale) with one fp32 scale per tensor that maps max|x| to FP8's max (448)."""
    amax = x.abs().max().float().clamp(min=1e-12)
    scale = amax / FP8_MAX
    return (x / scale).to(torch.float8_e4m3fn), scale


def fp8_matmul(a: torch.Tensor, b: torch.Tensor, emulate: bool = False) -> torch.Tensor:
    """a @ b with both inputs rounded to scaled e4m3 and the result in bf16.

    On an FP8 GPU it calls torch._scaled_mm (B column-major, sizes multiples of 16); with
    emulate=True it applies the same roundings and multiplies in fp64 (any device).
    """
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} and b on {b.device}: move both to one device first")
    a8, sa = to_fp8(a)
    b8, sb = to_fp8(b)
    if emulate:
        return ((a8.double() * sa.double()) @ (b8.double() * sb.double())).to(torch.bfloat16)
    ok, why = fp8_supported(a.device)
    if not ok:
        raise RuntimeError(f"{why}; pass emulate=True to see FP8's rounding error without its speed")
    if any(s % 16 for s in (*a.shape, b.shape[1])):
        raise ValueError(f"torch._scaled_mm needs sizes that are multiples of 16, "
                         f"got {tuple(a.shape)} @ {tuple(b.shape)}")
    out = compat.scaled_mm()(a8, b8.t().contiguous().t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    return out[0] if isinstance(out, tuple) else out  # older torch returned (out, amax)


def fp8_rate(n: int, device: torch.device | str | None = None, rep_ms: float = 100.0) -> MatmulRate:
    """Time an n^3 FP8 matmul (inputs already in e4m3 with their scales, output bf16) with torch._scaled_mm."""
    _check_size(n)
    dev = torch.device(device) if device is not None else current().device
    ok, why = fp8_supported(dev)
    if not ok:
        raise RuntimeError(why)
    a8, sa = to_fp8(torch.randn(n, n, device=dev))
    b8, sb = to_fp8(torch.randn(n, n, device=dev))
    b8 = b8.t().contiguous().t()
    scaled_mm = compat.scaled_mm()
    t = bench(lambda: scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), rep_ms=rep_ms, device=dev)
    return MatmulRate(n=n, precision="fp8", timing=t, tflops=tflops(2 * n**3, t.median_ms))
