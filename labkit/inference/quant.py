"""Weight-only int8 and fp8: each output row's weights scaled by their absolute maximum (to 127, or to fp8 e4m3's
448) and rounded; on a GPU a decode step's product converts them in registers (labkit.kernels.dequant_matvec),
so it reads 1 byte per weight instead of 2 (activations stay bf16). int8 rounds to a fixed step per row; fp8 keeps
3 mantissa bits of every weight.

Used by: notebook 14.
"""
from __future__ import annotations

import importlib

import torch
import torch.nn as nn
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn


def quantize_rows(w: torch.Tensor, dtype: torch.dtype = torch.int8) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 or fp8 e4m3 weights, one float32 scale per row) with w ~ q * scale: int8 within scale / 2 per weight,
    fp8 within 1/16 of each weight (3 mantissa bits; the row's largest maps to 448)."""
    if dtype not in (torch.int8, FP8):
        raise ValueError(f"quantize_rows: dtype must be torch.int8 or torch.float8_e4m3fn, not {dtype}")
    top = 127.0 if dtype == torch.int8 else torch.finfo(FP8).max
    scale = (w.detach().float().abs().amax(dim=1) / top).clamp(min=1e-12)
    x = w.detach().float() / scale[:, None]
    q = torch.round(x).clamp(-127, 127).to(torch.int8) if dtype == torch.int8 else x.clamp(-top, top).to(FP8)
    return q, scale


class QuantLinear(nn.Module):
    """y = (x @ q.T) * scale + bias, q int8 (or fp8 e4m3 with weights=FP8): the dequantization is one multiply
    per output, after the products' sum.

    On a GPU, a few rows of x (a decode step, eager or under torch.compile) go through labkit's kernel, which reads
    each one-byte weight once and converts it in registers; on the CPU, and for many rows (prefill), the weights
    are converted first and a matmul does the product.
    """

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, weights: torch.dtype = torch.int8):
        super().__init__()
        q, scale = quantize_rows(linear.weight, weights)
        self.register_buffer("q", q)
        self.register_buffer("scale", scale.to(dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(dtype))
        if self.q.is_cuda:
            _load_gpu_matvec()

    def _apply(self, fn, recurse=True):  # .to(), .cuda(): weights moved to a GPU load its kernel
        out = super()._apply(fn, recurse)
        if self.q.is_cuda:
            _load_gpu_matvec()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (_gpu_matvec and x.is_cuda and x.numel() <= _matvec_rows * x.shape[-1] and x.dtype in _matvec_dtypes
                and not (x.requires_grad and torch.is_grad_enabled())):  # (the kernel has no backward)
            if torch.compiler.is_compiling():  # the custom op: one node of the compiled graph
                return torch.ops.labkit.dequant_matvec(x, self.q, self.scale, self.bias)
            return _gpu_matvec(x, self.q, self.scale, self.bias)
        y = F.linear(x, self.q.to(x.dtype)) * self.scale
        return y if self.bias is None else y + self.bias


# labkit's one-byte matrix-vector kernel once a QuantLinear's weights are on a GPU, with the rows and x dtypes it
# takes: imported then (a CPU run never imports Triton for it), with the custom op torch.compile traces (it cannot
# import while tracing); False where labkit's kernels are interpreted (labkit.setup() chose the CPU).
_gpu_matvec = None
_matvec_rows, _matvec_dtypes = 0, ()


def _load_gpu_matvec() -> None:
    global _gpu_matvec, _matvec_rows, _matvec_dtypes
    if _gpu_matvec is None:
        kernel = importlib.import_module("labkit.kernels.dequant_matvec")
        importlib.import_module("labkit.kernels.ops")  # registers labkit::dequant_matvec
        _matvec_rows, _matvec_dtypes = kernel.MAX_ROWS, kernel.X_DTYPES
        _gpu_matvec = False if kernel.INTERPRETED else kernel.dequant_matvec


def quantized_copy(module: nn.Module, dtype: torch.dtype, weights: torch.dtype = torch.int8) -> nn.Module:
    """Replace every nn.Linear inside `module` (in place) with an QuantLinear of the same weights (int8, or fp8
    with weights=FP8); returns it."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, QuantLinear(child, dtype, weights))
        else:
            quantized_copy(child, dtype, weights)
    return module


def weight_error(original: nn.Module, quantized: nn.Module) -> float:
    """||W_q * scale - W|| / ||W|| over every linear layer: the int8 (or fp8) weights' own relative error."""
    num = den = 0.0
    for a, b in zip(original.modules(), quantized.modules()):
        if isinstance(a, nn.Linear) and isinstance(b, QuantLinear):
            w = a.weight.detach().double()
            num += float(((b.q.double() * b.scale.double()[:, None] - w) ** 2).sum())
            den += float((w ** 2).sum())
    if den == 0:
        raise ValueError("weight_error: no nn.Linear in `original` has an QuantLinear twin in `quantized`")
    return (num / den) ** 0.5
