"""Asynchronous SGD in one process: what stale gradients do to convergence (no torchrun needed).

Used by: notebook 08.
"""
from __future__ import annotations

import math

import torch


def stale_sgd(staleness: int, steps: int = 200, lr_times_l: float = 0.5, dim: int = 32, batch: int = 16,
              seed: int = 0) -> list[float]:
    """Full-data loss per step of minibatch SGD on least squares when each gradient is `staleness` steps old.

    Asynchronous SGD in one process: the gradient applied at step t was computed on the parameters of
    step t - staleness (as if a slow worker had read them then). lr = lr_times_l / L, L the largest
    curvature, so 0.5 is a safe rate without staleness. Diverged losses are reported as inf.
    """
    if staleness < 0 or steps < 1:
        raise ValueError("staleness must be >= 0 and steps >= 1")
    g = torch.Generator().manual_seed(seed)
    n = 16 * dim
    x = torch.randn(n, dim, generator=g, dtype=torch.float64) * torch.linspace(0.2, 1.0, dim, dtype=torch.float64)
    w_true = torch.randn(dim, generator=g, dtype=torch.float64)
    y = x @ w_true + 0.01 * torch.randn(n, generator=g, dtype=torch.float64)
    curvature = float(torch.linalg.eigvalsh(x.T @ x / n).max())
    lr = lr_times_l / curvature
    w = torch.zeros(dim, dtype=torch.float64)
    history = [w.clone()] * (staleness + 1)  # parameters of the last staleness+1 steps
    losses = []
    for _ in range(steps):
        losses.append(float(0.5 * ((x @ w - y) ** 2).mean()))
        if not math.isfinite(losses[-1]) or losses[-1] > 1e12:
            losses[-1:] = [math.inf] * (steps - len(losses) + 1)
            break
        old = history[0]
        idx = torch.randint(0, n, (batch,), generator=g)
        grad = x[idx].T @ (x[idx] @ old - y[idx]) / batch
        w = w - lr * grad
        history = history[1:] + [w.clone()]
    return losses[:steps]
