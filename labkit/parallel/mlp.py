"""The small MLP and the deterministic batches that notebook 08's data-parallel runs train, and a checksum of
its parameters that tells two ranks' copies apart.

Used by: notebook 08 (through labkit.parallel.ddp).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn


def make_model(dim: int, hidden: int, layers: int) -> nn.Sequential:
    """An MLP dim -> hidden -> ... -> dim with ReLU between the Linear layers."""
    widths = [dim] + [hidden] * (layers - 1) + [dim]
    mods: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        mods.append(nn.Linear(a, b))
        if i < layers - 1:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def global_batch(step: int, n: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same (x, y) on every rank for a given step: a regression onto a fixed random map."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    teacher = torch.Generator().manual_seed(seed + 7)
    w = torch.randn(dim, dim, generator=teacher) / math.sqrt(dim)
    x = torch.randn(n, dim, generator=g)
    return x, torch.tanh(x @ w) + 0.1 * torch.randn(n, dim, generator=g)


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def checksum(model: nn.Module) -> torch.Tensor:
    """One float64 number that changes when any parameter changes (a weighted sum)."""
    flat = flat_params(model)
    weights = torch.cos(torch.arange(flat.numel(), dtype=torch.float64, device=flat.device))
    return (flat * weights).sum()
