"""Exercise 02, transfers: `pinned_copy(x)` and `overlapped_map(chunks, fn, device)`."""
from __future__ import annotations

from typing import Callable

import torch

from labkit.exercises.inputs import here, view
from labkit.exercises.observe import expect_tensor, snapshot
from labkit.exercises.spec import Function

NOTEBOOK = "02_transfers"

OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "affine": lambda t: t * 2.0 + 1.0,
    "sin_square": lambda t: torch.sin(t) * t,
}


def call_pinned_copy(fn, args):
    x = view(args["x"], args.get("view"))
    before = x.clone()
    out = fn(x)
    obs = {"copy": snapshot(out), "x left unchanged": bool(torch.equal(x, before))}
    if isinstance(out, torch.Tensor):
        obs["page-locked (pinned) when CUDA is available"] = bool(out.is_pinned())
        obs["contiguous"] = out.is_contiguous()
        obs["a separate copy (shares no memory with x)"] = (
            out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr())
    return obs


def pinned_copy_case(about: str, base: torch.Tensor, view_name: str | None, pinned: bool) -> dict:
    """pinned_copy of `view(base, view_name)`; `pinned`: whether the copy must be page-locked (CUDA present)."""
    return {"about": about, "args": {"x": base, "view": view_name},
            "expected": {"copy": expect_tensor(view(base, view_name).contiguous(), "cpu"), "x left unchanged": True,
                         "page-locked (pinned) when CUDA is available": pinned, "contiguous": True,
                         "a separate copy (shares no memory with x)": True}}


def visible_pinned_copy() -> list[dict]:
    """The classes of the hidden cases (contiguous, transposed, every other column; float32, float16, int64),
    with other sizes and values."""
    g = torch.Generator().manual_seed(3)
    pinned = torch.cuda.is_available()
    cases = []
    for shape, dtype, name in [((6, 4), torch.float32, None), ((3, 7), torch.float32, "transposed"),
                               ((5, 3), torch.float16, None), ((3, 13), torch.int64, "cols_step2")]:
        base = (torch.randn(shape, generator=g) * 100).to(dtype)
        shown = tuple(view(base, name).shape)
        cases.append(pinned_copy_case(f"x: {name or 'contiguous'} view of shape {shown}, {dtype}", base, name, pinned))
    return cases


def call_overlapped_map(fn, args):
    device = torch.device(args.get("device", "cpu"))
    out = fn(list(args["chunks"]), OPS[args["op"]], device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"outputs": snapshot(list(out) if isinstance(out, tuple) else out)}


def overlapped_map_case(about: str, chunks: list[torch.Tensor], op: str, device: str, tol: float) -> dict:
    """overlapped_map of OPS[op] over `chunks` on `device`, expected from float64."""
    return {"about": about, "args": {"chunks": chunks, "op": op, "device": device},
            "expected": {"outputs": [expect_tensor(OPS[op](c.double()).float(), device) for c in chunks]},
            "rtol": tol, "atol": tol}


def visible_overlapped_map() -> list[dict]:
    g = torch.Generator().manual_seed(4)
    chunks = [torch.randn(1000, generator=g) for _ in range(3)]
    dev = str(here())
    return [overlapped_map_case(f"3 chunks of 1000 floats, fn = t * 2 + 1, on {dev}", chunks, "affine", dev, 1e-6)]


FUNCTIONS = [
    Function("pinned_copy", call_pinned_copy, visible_pinned_copy),
    Function("overlapped_map", call_overlapped_map, visible_overlapped_map),
]
