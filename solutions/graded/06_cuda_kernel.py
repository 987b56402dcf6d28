"""Graded cases for 06_cuda_kernel: sizes around the block size and a large one (GPU only)."""
import torch

from labkit.check import expect_tensor


def scale_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    cases = []
    for n in (1, 255, 256, 257, 100_003):
        alpha = round(float(torch.randn((), generator=g)) * 3, 3)
        x = torch.randn(n, generator=g)
        cases.append({"about": f"n={n}, alpha={alpha}", "args": {"x": x, "alpha": alpha},
                      "expected": expect_tensor((x.double() * alpha).float(), "cuda"), "rtol": 1e-6, "atol": 1e-6})
    return cases


EXERCISES = {"scale_kernel_source": {"points": 2, "cases": scale_cases, "needs_gpu": True, "stage2": "cuda_scale"}}
