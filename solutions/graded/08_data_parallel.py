"""Graded cases for 08_data_parallel: uneven micro-batches, other rank counts and shapes."""
import torch

from labkit.exercises.ex08_data_parallel import accumulated_grads_case, average_gradients_case
from labkit.exercises.inputs import mlp_state


def average_gradients_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    cases = []
    for ranks, shapes in [(1, [(5,)]), (4, [(3, 7), (1,), (2, 2, 3)]), (7, [(11,), (4, 5)])]:
        grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(ranks)]
        cases.append(average_gradients_case(f"{ranks} rank(s), parameter shapes {shapes}", grads, dev, 1e-5, 1e-6))
    return cases


def accumulated_grads_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    cases = []
    for sizes, batch, micro in [([4, 6, 3], 10, 4), ([2, 3, 1], 7, 7), ([5, 4, 2], 9, 2)]:
        state = mlp_state(g, sizes)
        x, y = torch.randn(batch, sizes[0], generator=g), torch.randn(batch, sizes[2], generator=g)
        cases.append(accumulated_grads_case(f"a batch of {batch} in micro-batches of {micro}, layer sizes {sizes}",
                                            sizes, state, x, y, micro, dev))
    return cases


EXERCISES = {
    "average_gradients": {"points": 1, "cases": average_gradients_cases},
    "accumulated_grads": {"points": 2, "cases": accumulated_grads_cases},
}
