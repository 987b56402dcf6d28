"""Graded cases for 01_device_placement: other shapes, ranks and devices than the visible checks."""
import torch

from labkit.exercises.ex01_device_placement import causal_mask_case, to_device_case
from labkit.exercises.inputs import mlp_state


def causal_mask_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    other = "cuda" if gpu else "meta"
    return [causal_mask_case(torch.randn(shape, generator=g), dev)
            for shape, dev in [((1, 1), "cpu"), ((3, 7, 5), "cpu"), ((2, 1, 33, 4), "cpu"), ((6, 9), other),
                               ((2, 17, 3), other)]]


def to_device_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    target = "cuda" if gpu else "meta"
    cases = []
    for sizes, as_string in [([4, 3, 5], True), ([2, 7, 1], False)]:
        state = mlp_state(g, sizes)
        x = torch.randn(6, sizes[0], generator=g)
        mask = torch.rand(6, generator=g) > 0.5
        batch = ({"x": x, "extra": [mask, 3, None]}, torch.arange(6, dtype=torch.int32), "tag")
        kind = "a string" if as_string else "a torch.device"
        cases.append(to_device_case(f"a nested tuple/dict/list batch, device {target!r} given as {kind}",
                                    sizes, state, batch, target, as_string))
    return cases


EXERCISES = {
    "causal_mask": {"points": 1, "cases": causal_mask_cases},
    "to_device": {"points": 1, "cases": to_device_cases},
}
