"""Graded cases for 05_triton_row_sum: odd sizes, strided views, half precision."""
import torch

from labkit.check import expect_tensor


def row_sum_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    cases = []
    for shape, dtype, view in [((1, 1), torch.float32, None), ((3, 129), torch.float32, None),
                               ((9, 300), torch.float16, None), ((5, 70), torch.float32, "cols_step2"),
                               ((6, 40), torch.bfloat16, "row_slice"), ((33, 7), torch.float32, "transposed")]:
        base = torch.randn(shape, generator=g).to(dtype)
        x = base[:, ::2] if view == "cols_step2" else base[:, 1:-1] if view == "row_slice" else (
            base.t() if view == "transposed" else base)
        ncols = x.shape[1]
        cases.append({"about": f"x: {view or 'contiguous'} of shape {tuple(x.shape)}, {dtype}",
                      "args": {"x": base, "view": view, "device": dev},
                      "expected": expect_tensor(x.double().sum(1).float(), dev),
                      "rtol": 1e-4, "atol": 2e-5 * ncols})
    return cases


EXERCISES = {"row_sum": {"points": 2, "cases": row_sum_cases, "requires_triton": True}}
