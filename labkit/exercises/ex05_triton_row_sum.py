"""Exercise 05, a Triton kernel: `row_sum(x)` sums each row of a 2-D tensor, through any strides."""
from __future__ import annotations

import torch

from labkit.exercises.inputs import here, view
from labkit.exercises.observe import expect_tensor, snapshot
from labkit.exercises.spec import Function

NOTEBOOK = "05_triton_row_sum"


def call_row_sum(fn, args):
    x = view(args["x"].to(torch.device(args.get("device", "cpu"))), args.get("view"))
    return snapshot(fn(x))


def row_sum_case(about: str, base: torch.Tensor, view_name: str | None, device: str, atol: float | None = None) -> dict:
    """row_sum of `view(base, view_name)` on `device`, against a float64 sum (atol grows with the row length)."""
    x = view(base, view_name)
    return {"about": about, "args": {"x": base, "view": view_name, "device": device},
            "expected": expect_tensor(x.double().sum(1).float(), device),
            "rtol": 1e-4, "atol": 2e-5 * x.shape[1] if atol is None else atol}


def visible_row_sum() -> list[dict]:
    g = torch.Generator().manual_seed(5)
    dev = str(here())
    x = torch.randn(4, 37, generator=g)
    return [row_sum_case(f"x of shape (4, 37) float32 on {dev}", x, None, dev, atol=1e-4)]


FUNCTIONS = [Function("row_sum", call_row_sum, visible_row_sum, requires_triton=True)]
