"""Exercise 01, device placement: `causal_mask(x)` made on x's device, `to_device(model, batch, device)`."""
from __future__ import annotations

from typing import Any

import torch

from labkit.exercises.inputs import here, make_mlp, mlp_state
from labkit.exercises.observe import expect_like, expect_tensor, snapshot
from labkit.exercises.spec import Function

NOTEBOOK = "01_device_placement"
PARAMS = ("0.weight", "0.bias", "2.weight", "2.bias")


def warm_meta(device: str) -> None:
    """'meta' stands in for a GPU on the CPU: its first op imports for seconds, not the student's time."""
    if device == "cpu":
        torch.ones(2, 2, dtype=torch.bool, device="meta").tril()


def call_causal_mask(fn, args):
    if args.get("device") == "meta":  # meta has no values: also run the same input on the CPU
        return {"result on meta": snapshot(fn(args["x"].to("meta"))),
                "values (same input on the cpu)": snapshot(fn(args["x"]))}
    return snapshot(fn(args["x"].to(torch.device(args.get("device", "cpu")))))


def expect_mask(t: int, device: str) -> Any:
    """The expected observation of causal_mask for a (.., t, ..) input on `device`."""
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    if device == "meta":
        return {"result on meta": expect_tensor(mask, "meta"),
                "values (same input on the cpu)": expect_tensor(mask, "cpu")}
    return expect_tensor(mask, device)


def causal_mask_case(x: torch.Tensor, device: str) -> dict:
    """x (on the CPU) handed to causal_mask on `device`."""
    return {"about": f"x of shape {tuple(x.shape)} on {device}", "args": {"x": x, "device": device},
            "expected": expect_mask(x.shape[-2], device)}


def visible_causal_mask() -> list[dict]:
    """A 3-D input on each device, then 2-D and 4-D ones (the hidden cases' ranks): T is x.shape[-2], whatever the rank,
    and no dimension but that one has T's size here."""
    g = torch.Generator().manual_seed(1)
    devices = [str(here())] + (["meta"] if here().type == "cpu" else [])
    cases = [causal_mask_case(torch.randn(2, 5, 3, generator=g), dev) for dev in devices]
    return cases + [causal_mask_case(torch.randn(shape, generator=g), str(here())) for shape in [(4, 6), (2, 3, 6, 2)]]


def call_to_device(fn, args):
    model = make_mlp(args["sizes"], args["state"], torch.device("cpu"))
    device = args["device"] if args.get("as_string") else torch.device(args["device"])
    out = fn(model, args["batch"], device)
    pair = isinstance(out, (tuple, list)) and len(out) == 2
    return {"returns (model, batch)": pair,
            "returns the same model object (moved in place)": pair and out[0] is model,
            "model parameters": snapshot(list(model.parameters())),
            "batch": snapshot(out[1]) if pair else None}


def to_device_case(about: str, sizes: list[int], state: dict, batch: Any, target: str, as_string: bool = False) -> dict:
    """An MLP of `sizes` (weights `state`) and `batch` (any nesting of tensors), moved to `target`."""
    return {"about": about,
            "args": {"sizes": sizes, "state": state, "batch": batch, "device": target, "as_string": as_string},
            "expected": {"returns (model, batch)": True, "returns the same model object (moved in place)": True,
                         "model parameters": [expect_tensor(state[k], target) for k in PARAMS],
                         "batch": expect_like(batch, target)}}


def visible_to_device() -> list[dict]:
    g = torch.Generator().manual_seed(2)
    target = "cuda" if here().type == "cuda" else "meta"
    state = mlp_state(g, [3, 4, 2])
    batch = {"x": torch.randn(5, 3, generator=g), "y": torch.arange(5), "name": "batch0"}
    return [to_device_case(f"an MLP and a dict batch moved to {target}", [3, 4, 2], state, batch, target)]


FUNCTIONS = [
    Function("causal_mask", call_causal_mask, visible_causal_mask, prepare=warm_meta),
    Function("to_device", call_to_device, visible_to_device, prepare=warm_meta),
]
