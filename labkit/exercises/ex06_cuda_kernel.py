"""Exercise 06, a CUDA kernel: `scale_kernel_source()` returns CUDA C for `scale_kernel`, built with
the instructor's host wrapper (SCALE_WRAPPER) and run on a GPU. The grader builds it in a second
stage, in a fresh process with no student code."""
from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import torch

from labkit.exercises.feedback import describe_error, run_cases
from labkit.exercises.observe import compare, expect_tensor, snapshot
from labkit.exercises.spec import Function, Stage

NOTEBOOK = "06_cuda_kernel"
NAME = "scale_kernel_source"

SCALE_KERNEL_HEADER = """#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>
#include <limits>
"""
SCALE_WRAPPER = """
torch::Tensor scale(torch::Tensor x, double alpha) {
    TORCH_CHECK(x.is_cuda(), "scale: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "scale: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "scale: x must be contiguous");
    auto out = torch::full_like(x, std::numeric_limits<float>::quiet_NaN());  // unwritten -> NaN
    const int64_t n = x.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    if (n > 0) {
        scale_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            x.data_ptr<float>(), out.data_ptr<float>(), static_cast<float>(alpha), n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return out;
}
"""


_built: dict[str, Any] = {}


def build_scale_extension(kernel_source: str, name: str | None = None, build_dir: str | None = None,
                          verbose: bool = False):
    """Compile a student's `scale_kernel` with the host wrapper; the module has `scale(x, alpha)`.

    Without a name, the module is named after the source (so a rebuild of the same code is a no-op)
    and kept for this process.
    """

    from torch.utils.cpp_extension import load_inline

    key = None if name or build_dir else kernel_source
    if key is not None and key in _built:
        return _built[key]
    name = name or f"labkit_scale_{zlib.crc32(kernel_source.encode()):08x}"
    if build_dir:
        os.makedirs(build_dir, exist_ok=True)
    module = load_inline(name=name, cpp_sources="torch::Tensor scale(torch::Tensor x, double alpha);",
                         cuda_sources=SCALE_KERNEL_HEADER + kernel_source + SCALE_WRAPPER,
                         functions=["scale"], build_directory=build_dir, verbose=verbose,
                         extra_cuda_cflags=["-O2"])
    if key is not None:
        _built[key] = module
    return module


def have_cuda_toolchain() -> bool:
    """A CUDA GPU, a matching nvcc and ninja: what building the student's kernel needs (labkit.cuda's probe)."""
    from labkit import cuda
    return cuda.missing() is None


def call_source(fn, args):
    return {"source": snapshot(fn())}


def source_of(obs: Any) -> str:
    """The CUDA source in the observation of scale_kernel_source(); ValueError when it is not one."""
    src = obs.get("source") if isinstance(obs, dict) else None
    if not isinstance(src, str) or "__global__" not in src or "scale_kernel" not in src:
        raise ValueError("expected a string of CUDA C defining `__global__ void scale_kernel(...)`")
    return src


def call_scale(ext, args):
    got = ext.scale(args["x"].cuda(), float(args["alpha"]))
    torch.cuda.synchronize()
    return snapshot(got)


def build_and_run(source: str, cases: list[dict], scratch: Path) -> list[dict]:
    """The grader's second stage: build `source` and run it on each case's args."""
    name = f"grade_scale_{zlib.crc32((str(scratch) + source).encode()):08x}"
    try:
        ext = build_scale_extension(source, name=name, build_dir=str(scratch / "ext"))
    except Exception as exc:
        lines = [ln for ln in str(exc).splitlines() if "error" in ln.lower()][:6]
        msg = "the kernel did not compile: " + (" | ".join(lines) or str(exc)[:500])
        return [{"error": msg} for _ in cases]
    out: list[dict] = []
    for case in cases:
        try:
            out.append({"obs": call_scale(ext, case["args"])})
        except Exception as exc:
            out.append({"error": describe_error(exc)})
    return out


def scale_case(x: torch.Tensor, alpha: float) -> dict:
    """scale(x, alpha) on the GPU, against float64."""
    return {"about": f"n={x.numel()}, alpha={alpha}", "args": {"x": x, "alpha": alpha},
            "expected": expect_tensor((x.double() * alpha).float(), "cuda"), "rtol": 1e-6, "atol": 1e-6}


def check_scale_kernel_source(fn: Any) -> bool:
    """Check the CUDA kernel source: build and run it on a GPU; without one, say so in one line."""
    try:
        src = fn()
    except Exception as exc:
        print(f"{'…' if isinstance(exc, NotImplementedError) else '✗'} {NAME}: {describe_error(exc)}")
        return False
    try:
        source_of({"source": src})
    except ValueError:
        print(f"✗ {NAME}: expected a string of CUDA C defining `__global__ void scale_kernel(...)`, "
              f"got {type(src).__name__}")
        return False
    if not have_cuda_toolchain():
        print(f"[skipped on this machine] {NAME}: building and running a CUDA kernel needs a GPU and nvcc "
              f"(the grader marks it 'needs GPU' on a machine without them).")
        return False
    try:
        ext = build_scale_extension(src)
    except Exception as exc:
        lines = [ln for ln in str(exc).splitlines() if "error" in ln.lower()][:5]
        print(f"✗ {NAME}: the kernel did not compile:\n  " + "\n  ".join(lines or [str(exc)[:300]]))
        return False
    g = torch.Generator().manual_seed(8)
    cases = [scale_case(torch.randn(n, generator=g), 1.5) for n in (1, 257, 10_000)]
    if not run_cases(NAME, ext, call_scale, cases, compare):
        return False
    print(f"✓ {NAME}: built and ran on {len(cases)} sizes (unwritten elements would show as NaN)")
    return True


FUNCTIONS = [Function(NAME, call_source, check=check_scale_kernel_source, needs_gpu=True,
                      stage=Stage(take=source_of, run=build_and_run))]
