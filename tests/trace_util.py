"""Traces for the profiling tests: one recorded now on the CPU, one hand-built in the shape of a GPU run."""
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function


def record_cpu_trace(path: Path) -> Path:
    """A real torch.profiler trace of a few small CPU ops: range "work" (5 x mm, relu, sum), range "other" (exp)."""
    x = torch.randn(37, 53)
    w = torch.randn(53, 29)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("work"):
            for _ in range(5):
                y = torch.relu(x @ w)
                y = y.sum(dim=0)
        with record_function("other"):
            torch.exp(x)
    prof.export_chrome_trace(str(path))
    return path


def gpu_like_trace(n=6, launch=5.0, kernel=2.0, gap=20.0):
    """A trace shaped as torch.profiler writes a CUDA run: launches on the host, kernels on the device,
    linked by 'correlation'; each kernel starts 1 us after its launch ends."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "loop", "ts": 0.0, "dur": n * gap + 1, "tid": 1, "pid": 1}]
    for i in range(n):
        t = i * gap
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": t, "dur": launch + 2, "tid": 1, "pid": 1,
                   "args": {"External id": i}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 1, "dur": launch, "tid": 1,
                   "pid": 1, "args": {"correlation": 100 + i}})
        ev.append({"ph": "X", "cat": "kernel", "name": "gemm_small", "ts": t + 2 + launch, "dur": kernel, "tid": 7,
                   "pid": 0, "args": {"correlation": 100 + i, "grid": [1, 1, 1], "Python id": 3}})
        ev.append({"ph": "X", "cat": "python_function", "name": "loop.py(3): step", "ts": t, "dur": 9, "tid": 1,
                   "pid": 1})
    ev.append({"ph": "X", "cat": "kernel", "name": "outside", "ts": 1e4, "dur": 1, "tid": 7, "pid": 0,
               "args": {"correlation": 999}})
    ev.append({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}})
    return {"schemaVersion": 1, "traceEvents": ev}
