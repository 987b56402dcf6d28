"""Graded cases for 02_transfers: non-contiguous inputs, several dtypes, odd chunk counts."""
import torch

from labkit.exercises.ex02_transfers import overlapped_map_case, pinned_copy_case
from labkit.exercises.inputs import view


def pinned_copy_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    cases = []
    for shape, dtype, name in [((5, 3), torch.float32, "transposed"), ((7, 9), torch.float16, None),
                               ((4, 11), torch.int64, "cols_step2")]:
        base = (torch.randn(shape, generator=g) * 100).to(dtype)
        about = f"x: {name or 'contiguous'} view of shape {tuple(view(base, name).shape)}, {dtype}"
        cases.append(pinned_copy_case(about, base, name, gpu))
    return cases


def overlapped_map_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    n = 1 << 20 if gpu else 3001  # large chunks on a GPU, so a missing wait on the copy shows
    cases = []
    for count, op in [(1, "sin_square"), (5, "affine"), (4, "sin_square")]:
        chunks = [torch.randn(n + i, generator=g) for i in range(count)]
        cases.append(overlapped_map_case(f"{count} chunk(s) of about {n} floats, op {op}, on {dev}",
                                         chunks, op, dev, 1e-5))
    return cases


EXERCISES = {
    "pinned_copy": {"points": 1, "cases": pinned_copy_cases},
    "overlapped_map": {"points": 1, "cases": overlapped_map_cases},
}
