"""Exercise 99, a toy: `double(x)`, and `triple_source()`, an expression run in a second stage."""
from __future__ import annotations

from pathlib import Path

import torch

from labkit.exercises.feedback import run_cases
from labkit.exercises.inputs import here, view
from labkit.exercises.observe import compare, expect_tensor, snapshot
from labkit.exercises.spec import Function, Stage

NOTEBOOK = "99_toy"


def call_double(fn, args):
    return snapshot(fn(view(args["x"].to(torch.device(args.get("device", "cpu"))), args.get("view"))))


def double_case(x: torch.Tensor, view_name: str | None, device: str) -> dict:
    v = view(x, view_name)
    return {"about": f"x: {view_name or 'contiguous'} of shape {tuple(v.shape)} on {device}",
            "args": {"x": x, "view": view_name, "device": device},
            "expected": expect_tensor((v.double() * 2).float(), device), "rtol": 1e-6, "atol": 1e-6}


def visible_double() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [double_case(torch.randn(3, 4, generator=g), None, str(here()))]


def call_source(fn, args):
    return {"source": snapshot(fn())}


def take_source(obs) -> str:
    src = obs.get("source") if isinstance(obs, dict) else None
    if not isinstance(src, str):
        raise ValueError("expected a string: a Python expression in x")
    return src


def run_source(src: str, cases: list[dict], scratch: Path) -> list[dict]:
    out = []
    for case in cases:
        try:
            out.append({"obs": snapshot(eval(src, {"x": case["args"]["x"]}))})
        except Exception as exc:
            out.append({"error": f"raised {type(exc).__name__}: {exc}"})
    return out


def triple_case(x: torch.Tensor) -> dict:
    return {"about": f"x of shape {tuple(x.shape)}", "args": {"x": x},
            "expected": expect_tensor((x.double() * 3).float(), "cpu"), "rtol": 1e-6, "atol": 1e-6}


def check_triple(fn) -> bool:
    ok = run_cases("triple_source", fn, lambda f, args: snapshot(eval(f(), {"x": args["x"]})),
                   [triple_case(torch.arange(4.0))], compare)
    print("✓ triple_source" if ok else "")
    return ok


FUNCTIONS = [
    Function("double", call_double, visible_double),
    Function("triple_source", call_source, check=check_triple, stage=Stage(take=take_source, run=run_source)),
]
