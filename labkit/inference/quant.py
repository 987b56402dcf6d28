"""Weight-only int8 and fp8: each output row's weights scaled by their absolute maximum (to 127, or to fp8 e4m3's
448) and rounded; the matmul dequantizes on the fly, so a decode step reads 1 byte per weight instead of 2
(activations stay bf16). int8 rounds to a fixed step per row; fp8 keeps 3 mantissa bits of every weight.

Used by: notebook 14.
"""
from __future__ import annotations

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
    per output, after the matmul.

    Under torch.compile with a few rows (decode), the product is written as multiply-and-sum so that the compiler
    fuses the int8 -> float conversion into one reduction that reads each int8 weight once; eager PyTorch (and
    many rows) converts the weights first and calls the matmul.
    """

    ROWDOT_MAX_ROWS = 8

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, weights: torch.dtype = torch.int8):
        super().__init__()
        q, scale = quantize_rows(linear.weight, weights)
        self.register_buffer("q", q)
        self.register_buffer("scale", scale.to(dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(dtype))

    def rowdot(self, x: torch.Tensor) -> torch.Tensor:
        """x @ q.T as a broadcast multiply and a float32 sum over the inputs (a matrix-vector product per row)."""
        return (x.unsqueeze(-2).float() * self.q.float()).sum(-1).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() and x.numel() // x.shape[-1] <= self.ROWDOT_MAX_ROWS:
            y = self.rowdot(x) * self.scale
        else:
            y = F.linear(x, self.q.to(x.dtype)) * self.scale
        return y if self.bias is None else y + self.bias


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
