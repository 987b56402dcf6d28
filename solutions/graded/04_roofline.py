"""Graded cases for 04_roofline: random shapes, precisions and machines."""
import torch

from labkit.exercises.ex04_roofline import attainable_case, flops_bytes_case


def matmul_flops_bytes_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    cases = []
    for _ in range(6):
        m, n, k = (int(v) for v in torch.randint(1, 5000, (3,), generator=g))
        itemsize = [1, 2, 4, 8][int(torch.randint(0, 4, (), generator=g))]
        cases.append(flops_bytes_case(f"m={m}, n={n}, k={k}, itemsize={itemsize}", m, n, k, itemsize,
                                      2 * m * n * k, (m * k + k * n + m * n) * itemsize))
    return cases


def attainable_tflops_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    cases = []
    for _ in range(8):
        flops = float(10 ** (6 + 8 * torch.rand((), generator=g, dtype=torch.float64)))
        nbytes = float(10 ** (6 + 6 * torch.rand((), generator=g, dtype=torch.float64)))
        peak_tflops = float(1 + 999 * torch.rand((), generator=g, dtype=torch.float64))
        peak_gbps = float(50 + 5000 * torch.rand((), generator=g, dtype=torch.float64))
        expected = min(peak_tflops, flops / nbytes * peak_gbps / 1e3)
        cases.append(attainable_case(f"flops={flops:.4g}, nbytes={nbytes:.4g}, peaks {peak_tflops:.4g} TFLOP/s "
                                     f"and {peak_gbps:.4g} GB/s", flops, nbytes, peak_tflops, peak_gbps, expected))
    return cases


EXERCISES = {
    "matmul_flops_bytes": {"points": 1, "cases": matmul_flops_bytes_cases},
    "attainable_tflops": {"points": 1, "cases": attainable_tflops_cases},
}
