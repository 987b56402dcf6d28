"""Weight-only int8: each output row's weights scaled by their absolute maximum / 127 and rounded; the matmul
dequantizes on the fly, so a decode step reads 1 byte per weight instead of 2 (activations stay bf16).

Used by: notebook 14.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weights, one float32 scale per row) with w ~ q * scale, |error| <= scale / 2 per weight."""
    scale = (w.detach().float().abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w.detach().float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """y = (x @ q.T) * scale + bias, q int8: the dequantization is one multiply per output, after the matmul.

    Under torch.compile with a few rows (decode), the product is written as multiply-and-sum so that the compiler
    fuses the int8 -> float conversion into one reduction that reads each int8 weight once; eager PyTorch (and
    many rows) converts the weights first and calls the matmul.
    """

    ROWDOT_MAX_ROWS = 8

    def __init__(self, linear: nn.Linear, dtype: torch.dtype):
        super().__init__()
        q, scale = quantize_rows(linear.weight)
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


def int8_copy(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Replace every nn.Linear inside `module` (in place) with an Int8Linear of the same weights; returns it."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child, dtype))
        else:
            int8_copy(child, dtype)
    return module


def weight_error(original: nn.Module, quantized: nn.Module) -> float:
    """||W_int8 * scale - W|| / ||W|| over every linear layer: the int8 weights' own relative error."""
    num = den = 0.0
    for a, b in zip(original.modules(), quantized.modules()):
        if isinstance(a, nn.Linear) and isinstance(b, Int8Linear):
            w = a.weight.detach().double()
            num += float(((b.q.double() * b.scale.double()[:, None] - w) ** 2).sum())
            den += float((w ** 2).sum())
    if den == 0:
        raise ValueError("weight_error: no nn.Linear in `original` has an Int8Linear twin in `quantized`")
    return (num / den) ** 0.5
