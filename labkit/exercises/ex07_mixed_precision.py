"""Exercise 07, mixed precision: `found_inf(grads)` and `update_scale(...)`, a loss scaler's two halves."""
from __future__ import annotations

import torch

from labkit.exercises.inputs import here
from labkit.exercises.observe import snapshot
from labkit.exercises.spec import Function

NOTEBOOK = "07_mixed_precision"


def call_found_inf(fn, args):
    device = torch.device(args.get("device", "cpu"))
    grads = [None if g is None else g.to(device) for g in args["grads"]]
    out = fn(grads)
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        out = out.item()
    return {"found inf or nan": snapshot(out)}


def found_inf_case(about: str, grads: list, device: str, expected: bool) -> dict:
    """found_inf on `grads` (tensors or None) moved to `device`."""
    return {"about": about, "args": {"grads": grads, "device": device}, "expected": {"found inf or nan": expected}}


def visible_found_inf() -> list[dict]:
    dev = str(here())
    ok = [torch.ones(3, 2), None, torch.full((5,), 2.0)]
    bad = [torch.ones(3, 2), torch.tensor([1.0, float("inf")]).half()]
    nan = [torch.tensor([float("nan"), 0.0])]
    return [found_inf_case("finite gradients (one is None)", ok, dev, False),
            found_inf_case("an inf in an fp16 gradient", bad, dev, True),
            found_inf_case("a NaN", nan, dev, True)]


def call_update_scale(fn, args):
    scale, tracker, seen = args["scale"], 0, []
    for found in args["found_inf"]:
        out = fn(scale, found, tracker, growth_factor=args["growth_factor"],
                 backoff_factor=args["backoff_factor"], growth_interval=args["growth_interval"])
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            seen.append(snapshot(out))
            break
        scale, tracker = out
        seen.append((snapshot(scale), snapshot(tracker)))
    return {"(scale, growth_tracker) after each step": seen}


def update_scale_case(about: str, scale: float, found_inf: list[bool], growth_factor: float, backoff_factor: float,
                      growth_interval: int, expected: list[tuple[float, int]], rtol: float = 0.0) -> dict:
    """update_scale stepped through `found_inf` from `scale`; `expected`: (scale, tracker) after each step."""
    case = {"about": about,
            "args": {"scale": scale, "found_inf": found_inf, "growth_factor": growth_factor,
                     "backoff_factor": backoff_factor, "growth_interval": growth_interval},
            "expected": {"(scale, growth_tracker) after each step": expected}}
    return case | ({"rtol": rtol} if rtol else {})


def visible_update_scale() -> list[dict]:
    # worked by hand, growth_interval=2: ok, ok -> grow to 2048; inf -> back off to 1024; ok; inf -> 512
    return [update_scale_case("scale 1024, growth_interval 2, steps: ok, ok, inf, ok, inf", 1024.0,
                              [False, False, True, False, True], 2.0, 0.5, 2,
                              [(1024.0, 1), (2048.0, 0), (1024.0, 0), (1024.0, 1), (512.0, 0)])]


FUNCTIONS = [
    Function("found_inf", call_found_inf, visible_found_inf),
    Function("update_scale", call_update_scale, visible_update_scale),
]
