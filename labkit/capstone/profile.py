"""What the profiler says about a training loop, one step at a time: per-step counts and times from key_averages().

The figures each variant's claim checks: host syncs (.item()), DataLoader time, host-to-device copies,
kernel launches (on the CPU: aten ops dispatched), time in matmuls and in softmax, the pointwise kernels
torch.compile can fuse, the device's busy time, and the top kernels. Each figure is measured on several
steps profiled one by one, so it comes as `labkit.Samples` (median and spread) that claims resample.
"""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from labkit.stats import Samples

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # keep the profiler's chatter (even its USDT lines) out of the output
LAUNCH = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch"}
GEMM = re.compile(r"gemm|nvjet|xmma|cutlass.*(?:tensorop|wgmma)|cublas|s\d+_\w*mma|ampere_\w+|sm\d+_", re.I)
CPU_GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
CPU_SOFTMAX = {"aten::_softmax", "aten::_softmax_backward_data"}
# Pointwise kernels: eager PyTorch runs each elementwise op (add, GELU, a dtype cast, a copy) as one
# `*elementwise_kernel`; Inductor names the kernels it fuses them into `triton_poi_*` (reductions, such as a
# norm with the adds fused into it, are `triton_red_*` / `triton_per_*`). On the CPU: the aten ops that are such
# elementwise ops (compiled C++ kernels are not aten ops).
POINTWISE = re.compile(r"elementwise_kernel|^triton_poi_")
CPU_POINTWISE = {"aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::div", "aten::sub", "aten::gelu",
                 "aten::gelu_backward", "aten::_to_copy", "aten::copy_", "aten::masked_fill", "aten::neg", "aten::exp"}


@dataclass
class Row:
    name: str
    count: int
    self_us: float      # kernel time on the GPU; self CPU time on the CPU
    total_cpu_us: float
    on_device: bool


def _sum(rows: list[Row], pick, field: str = "self_us") -> float:
    return sum(getattr(r, field) for r in rows if pick(r))


def _syncs(rows: list[Row], gpu: bool) -> float:
    if gpu:
        return _sum(rows, lambda r: r.name == "cudaStreamSynchronize", "count")
    return _sum(rows, lambda r: r.name == "aten::_local_scalar_dense", "count")


def _loader_ms(rows: list[Row], gpu: bool) -> float:
    return _sum(rows, lambda r: r.name.startswith("enumerate(DataLoader)"), "total_cpu_us") / 1e3


def _h2d_copies(rows: list[Row], gpu: bool) -> float:
    return _sum(rows, lambda r: r.on_device and "HtoD" in r.name, "count")


def _launches(rows: list[Row], gpu: bool) -> float:
    if gpu:
        return _sum(rows, lambda r: r.name in LAUNCH, "count")
    return _sum(rows, lambda r: r.name.startswith("aten::"), "count")


def _gemm_ms(rows: list[Row], gpu: bool) -> float:
    if gpu:
        return _sum(rows, lambda r: r.on_device and bool(GEMM.search(r.name)) and "flash" not in r.name.lower()
                    and not r.name.startswith("triton")) / 1e3
    return _sum(rows, lambda r: r.name in CPU_GEMM) / 1e3


def _softmax_ms(rows: list[Row], gpu: bool) -> float:
    if gpu:
        return _sum(rows, lambda r: r.on_device and "softmax" in r.name.lower() and "flash" not in r.name.lower()
                    and not r.name.startswith("triton")) / 1e3
    return _sum(rows, lambda r: r.name in CPU_SOFTMAX) / 1e3


def _pointwise(rows: list[Row], gpu: bool) -> float:
    if gpu:
        return _sum(rows, lambda r: r.on_device and bool(POINTWISE.search(r.name)), "count")
    return _sum(rows, lambda r: r.name in CPU_POINTWISE, "count")


def _busy_ms(rows: list[Row], gpu: bool) -> float:
    return _sum(rows, lambda r: r.on_device if gpu else r.name.startswith("aten::")) / 1e3


METRICS = {"syncs": _syncs, "loader_ms": _loader_ms, "h2d_copies": _h2d_copies, "launches": _launches,
           "gemm_ms": _gemm_ms, "softmax_ms": _softmax_ms, "pointwise": _pointwise, "busy_ms": _busy_ms}
COUNTS = {"syncs", "h2d_copies", "launches", "pointwise"}  # events counted, not timed (labkit.Samples.counted)


@dataclass
class Profile:
    """key_averages() of single training steps, each profiled on its own (`windows`), as plain rows.

    `figure(metric)` gives one value per profiled step as labkit.Samples; the methods named after the metrics
    give the mean per step; `rows` sums every step (for tables)."""

    windows: list[list[Row]]
    gpu: bool

    @property
    def steps(self) -> int:
        return len(self.windows)

    @property
    def rows(self) -> list[Row]:
        merged: dict[tuple[str, bool], Row] = {}
        for rows in self.windows:
            for r in rows:
                m = merged.setdefault((r.name, r.on_device), Row(r.name, 0, 0.0, 0.0, r.on_device))
                m.count += r.count
                m.self_us += r.self_us
                m.total_cpu_us += r.total_cpu_us
        return list(merged.values())

    def figure(self, metric: str) -> Samples:
        """One value of `metric` per profiled step (syncs, loader_ms, launches, gemm_ms, pointwise, busy_ms, ...)."""
        return Samples.of((METRICS[metric](rows, self.gpu) for rows in self.windows), counted=metric in COUNTS)

    def mean(self, metric: str) -> float:
        return METRICS[metric](self.rows, self.gpu) / self.steps

    def syncs(self) -> float:
        """Host waits per step: stream synchronizes on a GPU (.item(), blocking copies); on a CPU the
        .item() calls themselves (aten::_local_scalar_dense), which cost no wait there."""
        return self.mean("syncs")

    def loader_ms(self) -> float:
        """Host time in the DataLoader's __next__ per step."""
        return self.mean("loader_ms")

    def h2d_copies(self) -> float:
        """Host-to-device copies per step (memcpy rows on the device)."""
        return self.mean("h2d_copies")

    def launches(self) -> float:
        """Kernel launches per step on a GPU (a CUDA-graph replay counts one); aten ops dispatched on a CPU."""
        return self.mean("launches")

    def gemm_ms(self) -> float:
        """Time in matmuls per step (GPU kernels by name; CPU aten matmul ops)."""
        return self.mean("gemm_ms")

    def softmax_ms(self) -> float:
        """Time in stand-alone softmax kernels per step (attention written out naively has them)."""
        return self.mean("softmax_ms")

    def pointwise(self) -> float:
        """Pointwise kernels per step: what torch.compile can fuse (not matmuls, attention, reductions or the
        optimizer's multi-tensor kernels)."""
        return self.mean("pointwise")

    def busy_ms(self) -> float:
        """Time of everything on the device per step (GPU), or self CPU time of every op (CPU)."""
        return self.mean("busy_ms")

    def top(self, k: int = 10) -> list[Row]:
        """The k rows that took the most time: GPU kernels, or CPU ops by self time."""
        rows = [r for r in self.rows if (r.on_device if self.gpu else r.name.startswith("aten::"))]
        return sorted(rows, key=lambda r: -r.self_us)[:k]

    def table(self, k: int = 10) -> str:
        unit = "GPU" if self.gpu else "CPU self"
        lines = [f"{'kernel' if self.gpu else 'op':<60} {'calls/step':>10} {unit + ' ms/step':>16}"]
        for r in self.top(k):
            lines.append(f"{r.name[:60]:<60} {r.count / self.steps:>10.1f} {r.self_us / self.steps / 1e3:>16.3f}")
        return "\n".join(lines)


def _rows(prof) -> list[Row]:
    rows = []
    for e in prof.key_averages():
        on_device = "cuda" in str(getattr(e, "device_type", "")).lower()
        if on_device and (getattr(e, "is_user_annotation", False) or e.key.startswith("ProfilerStep#")):
            continue  # a range drawn on the GPU timeline (the step's ProfilerStep#, record_function), not a kernel
        self_us = e.self_device_time_total if on_device else e.self_cpu_time_total
        rows.append(Row(e.key, e.count, float(self_us), float(e.cpu_time_total), on_device))
    return rows


def profile_steps(step, steps: int = 6, device: torch.device | str = "cpu") -> Profile:
    """Profile `steps` calls of step() one at a time (after the loop is warm): each profiled step follows an
    unprofiled one, and on a GPU ends with a synchronize so that all of its kernels are in its window."""
    gpu = torch.device(device).type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    windows: list[list[Row]] = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        with profile(activities=acts, schedule=schedule(wait=0, warmup=1, active=1, repeat=steps),
                     on_trace_ready=lambda p: windows.append(_rows(p))) as prof:
            for _ in range(2 * steps):
                step()
                if gpu:
                    torch.cuda.synchronize(device)
                prof.step()
    return Profile(windows, gpu)


# The evidence each step's claim checks: (figure, what it counts, holds when new <= factor x parent's, what the
# mechanism needs: "" anywhere, "tf32" TF32 tensor cores, "tensor cores" bf16 tensor cores with tiles to align to).
# bf16: the ideal is half of TF32's matmul time, but fc, out and the head have a dimension that is no multiple of 8
# (the hidden size, the vocabulary) and about half the FLOPs: bf16 buys them little until `padded`, so the bound is
# 0.85. padded: those GEMMs get bf16's aligned tile paths; they are a part of the step's matmuls only, so the
# step's matmul time falls by at least 5% (measured 2026-11-25: 0.27x on an H200, 0.91x on an H100). compile:
# Inductor fuses the elementwise ops of each block into fewer kernels; at least 15%
# fewer pointwise kernels (measured: 0.61x on an H200, 0.76x on an H100, with the same torch: the two GPUs' counts
# differ by 20 kernels a step, not yet explained).
EVIDENCE: dict[str, tuple[str, str, float, str]] = {
    "pinned": ("syncs", "host syncs per step", 0.5, ""),
    "device_data": ("loader_ms", "DataLoader ms per step", 0.1, ""),
    "tf32": ("gemm_ms", "matmul ms per step", 0.67, "tf32"),
    "bf16": ("gemm_ms", "matmul ms per step", 0.85, "tensor cores"),
    "fused_adamw": ("launches", "launches per step", 0.7, ""),
    "triton_adamw": ("launches", "launches per step", 0.7, ""),
    "sdpa": ("softmax_ms", "softmax ms per step", 0.2, ""),
    "flash": ("softmax_ms", "softmax ms per step", 0.2, ""),
    "compile": ("pointwise", "pointwise kernels per step", 0.85, ""),
    "reduce_overhead": ("launches", "launches per step", 0.3, ""),
    "padded": ("gemm_ms", "matmul ms per step", 0.95, "tensor cores"),
}


def missing_here(needs: str, device: torch.device | str) -> str:
    """'' when this machine has what a step's mechanism needs (EVIDENCE's last field), else what it lacks,
    read from the device itself (its type and compute capability)."""
    dev = torch.device(device)
    if not needs:
        return ""
    if dev.type != "cuda":
        return (f"{'TF32' if needs == 'tf32' else 'bf16'} tensor cores (a CUDA GPU of compute capability 8.0 or "
                f"newer); this run is on {dev.type}")
    major, minor = torch.cuda.get_device_capability(dev)
    if major < 8:
        return f"tensor cores with {needs} (compute capability 8.0 or newer); this GPU has {major}.{minor}"
    return ""
