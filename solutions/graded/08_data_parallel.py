"""Graded cases for 08_data_parallel: uneven micro-batches, other rank counts and shapes."""
import torch

from labkit.check import _mlp_args, accumulated_grads_expect, expect_tensor


def average_gradients_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    cases = []
    for ranks, shapes in [(1, [(5,)]), (4, [(3, 7), (1,), (2, 2, 3)]), (7, [(11,), (4, 5)])]:
        grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(ranks)]
        mean = [torch.stack([r[i].double() for r in grads]).mean(0).float() for i in range(len(shapes))]
        cases.append({"about": f"{ranks} rank(s), parameter shapes {shapes}", "args": {"grads": grads, "device": dev},
                      "expected": {"averaged gradients": [expect_tensor(m, dev) for m in mean]},
                      "rtol": 1e-5, "atol": 1e-6})
    return cases


def accumulated_grads_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    cases = []
    for sizes, batch, micro in [([4, 6, 3], 10, 4), ([2, 3, 1], 7, 7), ([5, 4, 2], 9, 2)]:
        state, _ = _mlp_args(g, sizes)
        x, y = torch.randn(batch, sizes[0], generator=g), torch.randn(batch, sizes[2], generator=g)
        cases.append({"about": f"a batch of {batch} in micro-batches of {micro}, layer sizes {sizes}",
                      "args": {"sizes": sizes, "state": state, "x": x, "y": y, "micro_batch": micro, "device": dev},
                      "expected": accumulated_grads_expect(sizes, state, x, y, dev), "rtol": 1e-4, "atol": 1e-5})
    return cases


EXERCISES = {
    "average_gradients": {"points": 1, "cases": average_gradients_cases},
    "accumulated_grads": {"points": 2, "cases": accumulated_grads_cases},
}
