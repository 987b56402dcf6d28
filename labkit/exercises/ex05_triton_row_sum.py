"""Exercise 05, a Triton kernel: `row_sum(x)` sums each row of a 2-D tensor, through any strides."""
from __future__ import annotations

import torch

from labkit.exercises import launches
from labkit.exercises.inputs import here, view
from labkit.exercises.observe import expect_tensor, snapshot
from labkit.exercises.spec import Function

NOTEBOOK = "05_triton_row_sum"


LAUNCHED = "a Triton kernel of the notebook read x (or a copy of it) and wrote the row sums returned"


def prepare(device: str) -> None:
    """In the grading child, before student code: hook Triton's launches (they are observed, not trusted)."""
    launches.install()


def call_row_sum(fn, args):
    x = view(args["x"].to(torch.device(args.get("device", "cpu"))), args.get("view"))
    with launches.record() as seen:
        out = fn(x)
    return {"row sums": snapshot(out), LAUNCHED: launches.touched(x, seen) and launches.produced(out, seen)}


def row_sum_case(about: str, base: torch.Tensor, view_name: str | None, device: str, atol: float | None = None) -> dict:
    """row_sum of `view(base, view_name)` on `device`, against a float64 sum (atol grows with the row length)."""
    x = view(base, view_name)
    return {"about": about, "args": {"x": base, "view": view_name, "device": device},
            "expected": {"row sums": expect_tensor(x.double().sum(1).float(), device), LAUNCHED: True},
            "rtol": 1e-4, "atol": 2e-5 * x.shape[1] if atol is None else atol}


def visible_row_sum() -> list[dict]:
    """The classes of the hidden cases (contiguous, every other column, a slice of rows, transposed; float32,
    float16, bfloat16; odd sizes; a row longer than a block of 128), with other sizes and values: a kernel ignoring
    stride_col fails here, and so does one that sums a single fixed block of columns without a loop."""
    g = torch.Generator().manual_seed(5)
    dev = str(here())
    cases = []
    for shape, dtype, name in [((4, 37), torch.float32, None), ((5, 51), torch.float16, None),
                               ((7, 33), torch.float32, "cols_step2"), ((4, 26), torch.bfloat16, "row_slice"),
                               ((21, 5), torch.float32, "transposed"), ((3, 200), torch.float32, None)]:
        base = torch.randn(shape, generator=g).to(dtype)
        x = view(base, name)
        cases.append(row_sum_case(f"x: {name or 'contiguous'} of shape {tuple(x.shape)}, {dtype}, on {dev}", base,
                                  name, dev))
    return cases


FUNCTIONS = [Function("row_sum", call_row_sum, visible_row_sum, prepare=prepare, requires_triton=True)]
