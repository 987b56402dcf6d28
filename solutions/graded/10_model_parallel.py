"""Graded cases for 10_model_parallel: more stages than micro-batches, one micro-batch, deep pipelines."""
import torch

from labkit.exercises.ex10_model_parallel import one_f_one_b_case


def one_f_one_b_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    cases = []
    for p, m in [(3, 5), (4, 2), (2, 1), (5, 9), (6, 6)]:
        cases.append(one_f_one_b_case(p, m, int(torch.randint(0, 10_000, (1,), generator=g))))
    return cases


EXERCISES = {
    "one_f_one_b": {"points": 2, "cases": one_f_one_b_cases},
}
