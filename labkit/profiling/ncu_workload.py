"""The two kernels the course profiles with ncu and nsys (a bandwidth-bound add, a compute-bound
matmul), their FLOPs from the model, and profiling them with ncu, falling back when a filter fails.

Used by: notebook 11 (through labkit.profiling).
"""
from __future__ import annotations

import sys
from pathlib import Path

from labkit.profiling import nsight
from labkit.profiling.ncu_report import KernelLaunch


def workload(n: int = 2**26, m: int = 4096, repeats: int = 3) -> None:
    """The ncu target: an fp32 add (bandwidth-bound) and a bf16 matmul (compute-bound), each run once
    inside its own NVTX range after `repeats` warm-up runs outside any range."""
    import torch

    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    for _ in range(repeats):
        a + b, x @ y
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("ncu_add")
    a + b
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_push("ncu_matmul")
    x @ y
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


def workload_flops(n: int = 2**26, m: int = 4096) -> dict[str, float]:
    """FLOPs of the workload's kernels from the model, keyed by a substring of the kernel name."""
    return {"elementwise": float(n), "gemm": 2.0 * m**3, "nvjet": 2.0 * m**3, "xmma": 2.0 * m**3,
            "cutlass": 2.0 * m**3}


def workload_ncu(report: Path, n: int = 2**26, m: int = 4096) -> tuple[list[KernelLaunch], str, list[str]]:
    """Profile the workload's two kernels: by NVTX range; if that matches nothing, by kernel name
    (skipping the warm-up launches); if ncu refuses a metric name, with the 'basic' section set.
    Returns (launches, message, the command that produced them)."""
    target = [sys.executable, "-m", "labkit.profiling", "workload", "--n", str(n), "--m", str(m)]
    attempts = [("NVTX ranges", dict(nvtx_ranges=["ncu_add", "ncu_matmul"], launch_count=4)),
                ("kernel name", dict(kernel_regex="vectorized_elementwise", launch_skip=3, launch_count=1)),
                ("NVTX ranges, --set basic", dict(nvtx_ranges=["ncu_add", "ncu_matmul"], launch_count=4,
                                                  metrics=(), section_set="basic"))]
    said = []
    for label, kw in attempts:
        cmd = nsight.ncu_command(target, report, **kw)
        launches, msg = nsight.run_ncu(cmd)
        said.append(f"{label}: {msg}")
        if launches or "not installed" in msg or "ERR_NVGPUCTRPERM" in msg:
            break
    return launches, "; ".join(said), cmd
