"""Exercise 08, data parallel: `average_gradients(grads)` and `accumulated_grads(model, x, y, micro_batch)`."""
from __future__ import annotations

import torch

from labkit.exercises.inputs import here, make_mlp, mlp_state
from labkit.exercises.observe import expect_tensor, snapshot
from labkit.exercises.spec import Function

NOTEBOOK = "08_data_parallel"


def call_average_gradients(fn, args):
    device = torch.device(args.get("device", "cpu"))
    grads = [[g.to(device) for g in rank] for rank in args["grads"]]
    return {"averaged gradients": snapshot(fn(grads))}


def average_gradients_case(about: str, grads: list[list[torch.Tensor]], device: str, rtol: float, atol: float) -> dict:
    """average_gradients over ranks' gradient lists, against their float64 mean."""
    mean = [torch.stack([r[i].double() for r in grads]).mean(0).float() for i in range(len(grads[0]))]
    return {"about": about, "args": {"grads": grads, "device": device},
            "expected": {"averaged gradients": [expect_tensor(m, device) for m in mean]}, "rtol": rtol, "atol": atol}


def visible_average_gradients() -> list[dict]:
    g = torch.Generator().manual_seed(6)
    dev = str(here())
    grads = [[torch.randn(3, 2, generator=g), torch.randn(4, generator=g)] for _ in range(3)]
    return [average_gradients_case(f"3 ranks, 2 parameters, on {dev}", grads, dev, 1e-6, 1e-6)]


def call_accumulated_grads(fn, args):
    device = torch.device(args.get("device", "cpu"))
    model = make_mlp(args["sizes"], args["state"], device)
    for p in model.parameters():  # stale gradients from an earlier step must not leak in
        p.grad = torch.ones_like(p)
    rows: list[int] = []
    model.register_forward_pre_hook(lambda mod, inp: rows.append(int(inp[0].shape[0])))
    out = fn(model, args["x"].to(device), args["y"].to(device), args["micro_batch"])
    return {"gradients": snapshot(list(out) if isinstance(out, tuple) else out),
            "every forward pass used at most micro_batch rows": bool(rows) and max(rows) <= args["micro_batch"]}


def accumulated_grads_case(about: str, sizes: list[int], state: dict, x: torch.Tensor, y: torch.Tensor,
                           micro_batch: int, device: str) -> dict:
    """Gradients of the mean squared error over (x, y) in micro-batches, against full-batch float64 gradients."""
    ref = make_mlp(sizes, state, torch.device("cpu")).double()
    torch.nn.functional.mse_loss(ref(x.double()), y.double()).backward()
    return {"about": about,
            "args": {"sizes": sizes, "state": state, "x": x, "y": y, "micro_batch": micro_batch, "device": device},
            "expected": {"gradients": [expect_tensor(p.grad.float(), device) for p in ref.parameters()],
                         "every forward pass used at most micro_batch rows": True},
            "rtol": 1e-4, "atol": 1e-5}


def visible_accumulated_grads() -> list[dict]:
    """A batch that micro_batch divides, and one it does not (the hidden cases have both): the last micro-batch of 11
    rows in 4s has 3, so each micro-batch's loss weighs its share of the rows, not 1/3."""
    g = torch.Generator().manual_seed(7)
    dev = str(here())
    state = mlp_state(g, [3, 5, 2])
    x, y = torch.randn(8, 3, generator=g), torch.randn(8, 2, generator=g)
    cases = [accumulated_grads_case(f"a batch of 8 in micro-batches of 4, on {dev}", [3, 5, 2], state, x, y, 4, dev)]
    x, y = torch.randn(11, 3, generator=g), torch.randn(11, 2, generator=g)
    return cases + [accumulated_grads_case(f"a batch of 11 in micro-batches of 4 (the last one 3 rows), on {dev}",
                                           [3, 5, 2], state, x, y, 4, dev)]


FUNCTIONS = [
    Function("average_gradients", call_average_gradients, visible_average_gradients),
    Function("accumulated_grads", call_accumulated_grads, visible_accumulated_grads),
]
