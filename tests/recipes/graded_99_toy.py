"""Graded cases for 99_toy: strided views, other sizes."""
import torch

from labkit.exercises.ex99_toy import double_case, triple_case


def double_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    return [double_case(torch.randn(5, 7, generator=g), v, "cpu") for v in (None, "transposed", "cols_step2")]


def triple_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    return [triple_case(torch.randn(n, generator=g)) for n in (1, 9)]


EXERCISES = {
    "double": {"points": 2, "cases": double_cases},
    "triple_source": {"points": 1, "cases": triple_cases},
}
