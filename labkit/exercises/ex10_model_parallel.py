"""Exercise 10, model parallelism: `one_f_one_b(stage, p, m)`, the 1F1B order of one pipeline stage.

Graded by the order itself, the activations it keeps in flight, and by running every stage's order
in one process (`pipeline.emulate`): the gradients must equal one process on the whole batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from labkit.exercises.observe import compare, expect_tensor, snapshot
from labkit.exercises.spec import Function
from labkit.parallel import pipeline

NOTEBOOK = "10_model_parallel"
DIM, LAYERS, ROWS = 5, 1, 2   # a small model: p stages of one Linear+GELU block, micro-batches of 2 rows


def _problem(p: int, m: int, seed: int):
    torch.manual_seed(seed)
    model = pipeline.make_model(p, LAYERS, DIM)
    x, y = pipeline.data(m * ROWS, DIM, seed)
    return model, x, y


def call_one_f_one_b(fn, args):
    p, m = args["p"], args["m"]
    orders = [[(str(op), int(i)) for op, i in fn(s, p, m)] for s in range(p)]
    obs = {"order of each stage": [" ".join(f"{op}{i}" for op, i in steps) for steps in orders],
           "micro-batches in flight per stage": [pipeline.in_flight(steps) for steps in orders]}
    model, x, y = _problem(p, m, args["seed"])
    try:
        pipeline.emulate(orders, [pipeline.stage_of(model, s, LAYERS) for s in range(p)], list(x.chunk(m)),
                         list(y.chunk(m)))
        obs["runs as a pipeline"] = "yes"
        obs["gradients"] = snapshot([q.grad for q in model.parameters()])
    except ValueError as exc:
        obs["runs as a pipeline"] = str(exc)
    return obs


def one_f_one_b_case(p: int, m: int, seed: int) -> dict:
    """The 1F1B orders of p stages over m micro-batches, and one process's float64 gradients."""
    orders = [pipeline.order_1f1b(s, p, m) for s in range(p)]
    model, x, y = _problem(p, m, seed)
    ref = model.double()
    F.mse_loss(ref(x.double()), y.double()).backward()
    return {"about": f"p={p} stages, m={m} micro-batches", "args": {"p": p, "m": m, "seed": seed},
            "expected": {"order of each stage": [" ".join(f"{op}{i}" for op, i in steps) for steps in orders],
                         "micro-batches in flight per stage": [min(p - s, m) for s in range(p)],
                         "runs as a pipeline": "yes",
                         "gradients": [expect_tensor(q.grad.float(), "cpu") for q in ref.parameters()]},
            "rtol": 1e-4, "atol": 1e-6}


def compare_orders(expected: dict, got, rtol: float = 0.0, atol: float = 0.0) -> list[str]:
    """Like observe.compare, but a stage whose order differs is shown with both orders in full."""
    key = "order of each stage"
    mine = got.get(key) if isinstance(got, dict) else None
    if not (isinstance(mine, list) and len(mine) == len(expected[key])):
        return compare(expected, got, rtol, atol)
    problems = [f"stage {s}: expected {e!r}, got {g!r}" for s, (e, g) in enumerate(zip(expected[key], mine)) if e != g]
    rest = {k: v for k, v in got.items() if k != key}
    return (problems + compare({k: v for k, v in expected.items() if k != key}, rest, rtol, atol))[:4]


def visible_one_f_one_b() -> list[dict]:
    return [one_f_one_b_case(2, 4, 0), one_f_one_b_case(4, 6, 1)]


FUNCTIONS = [Function("one_f_one_b", call_one_f_one_b, visible_one_f_one_b, compare=compare_orders,
                      answers=("labkit.parallel.pipeline.order_1f1b",))]  # a stub while graded
