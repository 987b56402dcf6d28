"""Graded cases for 02_transfers: non-contiguous inputs, several dtypes, odd chunk counts."""
import torch

from labkit.check import OPS, expect_tensor


def pinned_copy_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    cases = []
    for shape, dtype, view in [((5, 3), torch.float32, "transposed"), ((7, 9), torch.float16, None),
                               ((4, 11), torch.int64, "cols_step2")]:
        base = (torch.randn(shape, generator=g) * 100).to(dtype)
        x = base.t() if view == "transposed" else base[:, ::2] if view == "cols_step2" else base
        cases.append({"about": f"x: {view or 'contiguous'} view of shape {tuple(x.shape)}, {dtype}",
                      "args": {"x": base, "view": view},
                      "expected": {"copy": expect_tensor(x.contiguous(), "cpu"), "x left unchanged": True,
                                   "page-locked (pinned) when CUDA is available": gpu, "contiguous": True,
                                   "a separate copy (shares no memory with x)": True}})
    return cases


def overlapped_map_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    n = 1 << 20 if gpu else 3001  # large chunks on a GPU, so a missing wait on the copy shows
    cases = []
    for count, op in [(1, "sin_square"), (5, "affine"), (4, "sin_square")]:
        chunks = [torch.randn(n + i, generator=g) for i in range(count)]
        cases.append({"about": f"{count} chunk(s) of about {n} floats, op {op}, on {dev}",
                      "args": {"chunks": chunks, "op": op, "device": dev},
                      "expected": {"outputs": [expect_tensor(OPS[op](c.double()).float(), dev) for c in chunks]},
                      "rtol": 1e-5, "atol": 1e-5})
    return cases


EXERCISES = {
    "pinned_copy": {"points": 1, "cases": pinned_copy_cases},
    "overlapped_map": {"points": 1, "cases": overlapped_map_cases},
}
