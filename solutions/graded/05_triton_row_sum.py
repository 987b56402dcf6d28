"""Graded cases for 05_triton_row_sum: odd sizes, strided views, half precision."""
import torch

from labkit.exercises.ex05_triton_row_sum import row_sum_case
from labkit.exercises.inputs import view


def row_sum_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    cases = []
    for shape, dtype, name in [((1, 1), torch.float32, None), ((3, 129), torch.float32, None),
                               ((9, 300), torch.float16, None), ((5, 70), torch.float32, "cols_step2"),
                               ((6, 40), torch.bfloat16, "row_slice"), ((33, 7), torch.float32, "transposed")]:
        base = torch.randn(shape, generator=g).to(dtype)
        about = f"x: {name or 'contiguous'} of shape {tuple(view(base, name).shape)}, {dtype}"
        cases.append(row_sum_case(about, base, name, dev))
    return cases


EXERCISES = {"row_sum": {"points": 2, "cases": row_sum_cases}}
