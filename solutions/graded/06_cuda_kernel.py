"""Graded cases for 06_cuda_kernel: sizes around the block size and a large one (GPU only)."""
import torch

from labkit.exercises.ex06_cuda_kernel import scale_case


def scale_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    cases = []
    for n in (1, 255, 256, 257, 100_003):
        alpha = round(float(torch.randn((), generator=g)) * 3, 3)
        cases.append(scale_case(torch.randn(n, generator=g), alpha))
    return cases


EXERCISES = {"scale_kernel_source": {"points": 2, "cases": scale_cases}}
