"""Graded cases for 11_profiling: other model sizes, hyperparameters and seeds (fresh inputs for every timed call)."""
import torch

from labkit.exercises.ex11_profiling import MAX_RUNS, describe, fast_train_case, for_device


def fast_train_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    plans = [({"steps": 12, "batch": 16, "d_in": 96, "hidden": 192, "d_out": 8},
              {"lr": 0.03, "momentum": 0.8, "max_norm": 1.2}),
             ({"steps": 10, "batch": 24, "d_in": 48, "hidden": 256, "d_out": 24},
              {"lr": 0.08, "momentum": 0.85, "max_norm": 0.8})]
    cases = []
    for sizes, hyper in plans:
        sizes = for_device(sizes, dev)
        seeds = torch.randint(0, 2**31 - 1, (MAX_RUNS,), generator=g).tolist()
        cases.append(fast_train_case(describe(sizes, hyper, dev), sizes, hyper, seeds, dev))
    return cases


EXERCISES = {"fast_train": {"points": 2, "cases": fast_train_cases}}
