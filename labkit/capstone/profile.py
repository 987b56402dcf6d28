"""What the profiler says about a few training steps: per-step counts and times from key_averages().

The figures each variant's claim checks: host syncs (.item()), DataLoader time, host-to-device copies,
kernel launches (on the CPU: aten ops dispatched), time in matmuls and in softmax, and the top kernels.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # keep the profiler's chatter (even its USDT lines) out of the output
LAUNCH = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch"}
GEMM = re.compile(r"gemm|nvjet|xmma|cutlass.*(?:tensorop|wgmma)|cublas|s\d+_\w*mma|ampere_\w+|sm\d+_", re.I)
CPU_GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
CPU_SOFTMAX = {"aten::_softmax", "aten::_softmax_backward_data"}


@dataclass
class Row:
    name: str
    count: int
    self_us: float      # kernel time on the GPU; self CPU time on the CPU
    total_cpu_us: float
    on_device: bool


@dataclass
class Profile:
    """key_averages() of `steps` training steps, as plain rows; per-step figures below."""

    rows: list[Row]
    steps: int
    gpu: bool

    def _sum(self, pick, field: str = "self_us") -> float:
        return sum(getattr(r, field) for r in self.rows if pick(r)) / self.steps

    def syncs(self) -> float:
        """Host waits per step: stream synchronizes on a GPU (.item(), blocking copies); on a CPU the
        .item() calls themselves (aten::_local_scalar_dense), which cost no wait there."""
        if self.gpu:
            return self._sum(lambda r: r.name == "cudaStreamSynchronize", "count")
        return self._sum(lambda r: r.name == "aten::_local_scalar_dense", "count")

    def loader_ms(self) -> float:
        """Host time in the DataLoader's __next__ per step."""
        return self._sum(lambda r: r.name.startswith("enumerate(DataLoader)"), "total_cpu_us") / 1e3

    def h2d_copies(self) -> float:
        """Host-to-device copies per step (memcpy rows on the device)."""
        return self._sum(lambda r: r.on_device and "HtoD" in r.name, "count")

    def launches(self) -> float:
        """Kernel launches per step on a GPU (a CUDA-graph replay counts one); aten ops dispatched on a CPU."""
        if self.gpu:
            return self._sum(lambda r: r.name in LAUNCH, "count")
        return self._sum(lambda r: r.name.startswith("aten::"), "count")

    def gemm_ms(self) -> float:
        """Time in matmuls per step (GPU kernels by name; CPU aten matmul ops)."""
        if self.gpu:
            return self._sum(lambda r: r.on_device and bool(GEMM.search(r.name)) and "flash" not in r.name.lower()
                             and not r.name.startswith("triton")) / 1e3
        return self._sum(lambda r: r.name in CPU_GEMM) / 1e3

    def softmax_ms(self) -> float:
        """Time in stand-alone softmax kernels per step (attention written out naively has them)."""
        if self.gpu:
            return self._sum(lambda r: r.on_device and "softmax" in r.name.lower() and "flash" not in r.name.lower()
                             and not r.name.startswith("triton")) / 1e3
        return self._sum(lambda r: r.name in CPU_SOFTMAX) / 1e3

    def busy_ms(self) -> float:
        """Time of everything on the device per step (GPU), or self CPU time of every op (CPU)."""
        return self._sum(lambda r: r.on_device if self.gpu else r.name.startswith("aten::")) / 1e3

    def figure(self, metric: str) -> float:
        return getattr(self, metric)()

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


def profile_steps(step, steps: int = 3, device: torch.device | str = "cpu") -> Profile:
    """Profile `steps` calls of step() (after the loop is warm) and keep key_averages() as rows."""
    gpu = torch.device(device).type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        if gpu:
            torch.cuda.synchronize(device)
    rows = []
    for e in prof.key_averages():
        on_device = "cuda" in str(getattr(e, "device_type", "")).lower()
        self_us = e.self_device_time_total if on_device else e.self_cpu_time_total
        rows.append(Row(e.key, e.count, float(self_us), float(e.cpu_time_total), on_device))
    return Profile(rows, steps, gpu)


# The evidence each step's claim checks: (figure, what it counts, holds when new <= factor x parent's)
EVIDENCE: dict[str, tuple[str, str, float]] = {
    "pinned": ("syncs", "host syncs per step", 0.5),
    "device_data": ("loader_ms", "DataLoader ms per step", 0.1),
    "tf32": ("gemm_ms", "matmul ms per step", 0.67),
    "bf16": ("gemm_ms", "matmul ms per step", 0.8),
    "fused_adamw": ("launches", "launches per step", 0.7),
    "triton_adamw": ("launches", "launches per step", 0.7),
    "sdpa": ("softmax_ms", "softmax ms per step", 0.2),
    "flash": ("softmax_ms", "softmax ms per step", 0.2),
    "compile": ("launches", "launches per step", 0.7),
    "reduce_overhead": ("launches", "launches per step", 0.3),
    "padded": ("gemm_ms", "matmul ms per step", 0.95),
}
