"""Graded cases for 10_model_parallel: more stages than micro-batches, one micro-batch, as many, more, deep
pipelines; each (p, m) drawn from a range of its class (a new draw per seed), so no table of orders holds them."""
import torch

from labkit.exercises.ex10_model_parallel import one_f_one_b_case


def one_f_one_b_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    cases = []
    p = draw(4, 9)
    pairs = [(p, draw(2, p - 1))]  # more stages than micro-batches
    pairs.append((draw(2, 8), 1))  # one micro-batch
    p = draw(2, 8)
    pairs.append((p, p))  # as many
    p = draw(2, 7)
    pairs.append((p, draw(p + 1, 3 * p + 2)))  # more micro-batches than stages
    p = draw(10, 16)
    pairs.append((p, draw(p, 2 * p + 8)))  # a deep pipeline
    for p, m in pairs:
        cases.append(one_f_one_b_case(p, m, int(torch.randint(0, 10_000, (1,), generator=g))))
    return cases


EXERCISES = {
    "one_f_one_b": {"points": 2, "cases": one_f_one_b_cases},
}
