"""Graded cases for 01_device_placement: other shapes, ranks and devices than the visible checks."""
import torch

from labkit.check import _mlp_args, expect_mask, expect_tensor


def causal_mask_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    other = "cuda" if gpu else "meta"
    cases = []
    for shape, dev in [((1, 1), "cpu"), ((3, 7, 5), "cpu"), ((2, 1, 33, 4), "cpu"), ((6, 9), other),
                       ((2, 17, 3), other)]:
        t = shape[-2]
        cases.append({"about": f"x of shape {shape} on {dev}",
                      "args": {"x": torch.randn(shape, generator=g), "device": dev},
                      "expected": expect_mask(t, dev)})
    return cases


def to_device_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    target = "cuda" if gpu else "meta"
    cases = []
    for sizes, as_string in [([4, 3, 5], True), ([2, 7, 1], False)]:
        state, _ = _mlp_args(g, sizes)
        x = torch.randn(6, sizes[0], generator=g)
        mask = torch.rand(6, generator=g) > 0.5
        batch = ({"x": x, "extra": [mask, 3, None]}, torch.arange(6, dtype=torch.int32), "tag")
        expected_batch = ({"x": expect_tensor(x, target), "extra": [expect_tensor(mask, target), 3, None]},
                          expect_tensor(torch.arange(6, dtype=torch.int32), target), "tag")
        params = [expect_tensor(state[k], target) for k in ("0.weight", "0.bias", "2.weight", "2.bias")]
        kind = "a string" if as_string else "a torch.device"
        cases.append({"about": f"a nested tuple/dict/list batch, device {target!r} given as {kind}",
                      "args": {"sizes": sizes, "state": state, "batch": batch, "device": target,
                               "as_string": as_string},
                      "expected": {"returns (model, batch)": True,
                                   "returns the same model object (moved in place)": True,
                                   "model parameters": params, "batch": expected_batch}})
    return cases


EXERCISES = {
    "causal_mask": {"points": 1, "cases": causal_mask_cases},
    "to_device": {"points": 1, "cases": to_device_cases},
}
