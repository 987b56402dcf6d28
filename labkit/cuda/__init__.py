"""labkit's CUDA C kernels, built from Python: vector add, naive and tiled matmul, block sum.

The kernels are plain CUDA files (`*.cu`, launchers declared in `labkit_cuda.cuh`) that nvcc
compiles in seconds; `binding.cpp` checks tensors and calls them on PyTorch's current stream.
`build()` compiles both with `torch.utils.cpp_extension.load` into a cache folder, so only the
first build on a machine is slow. Importing this module needs no GPU; calling a kernel without
one (or without nvcc) raises `CudaUnavailable` saying what is missing and what to do.
These are notebook 06's teaching kernels; the production kernels' CUDA halves (the Hopper cluster kernels)
live in labkit/kernels/cluster/, compiled at run time with NVRTC.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

SOURCE_DIR = Path(__file__).resolve().parent
HEADER = "labkit_cuda.cuh"
KERNEL_FILES = ("vector_add.cu", "matmul.cu", "reduce.cu")
BINDING = "binding.cpp"
INT_MAX = 2**31 - 1

__all__ = ["CudaUnavailable", "build", "build_dir", "missing", "sources", "vector_add", "matmul_naive",
           "matmul_tiled", "block_sum", "check_vector_add", "check_matmul", "check_block_sum",
           "check_on_gpu"]


class CudaUnavailable(RuntimeError):
    """This machine cannot build or run labkit's CUDA kernels (no GPU, no nvcc, no ninja)."""


def sources(name: str | None = None) -> dict[str, str] | str:
    """The source text: all files as {file name: text}, or one file's text by name."""
    names = (HEADER, *KERNEL_FILES, BINDING)
    if name is not None:
        if name not in names:
            raise ValueError(f"no source {name!r}: choose one of {', '.join(names)}")
        return (SOURCE_DIR / name).read_text()
    return {n: (SOURCE_DIR / n).read_text() for n in names}


# ---------------------------------------------------------------- what the machine lacks

def _gpu_seen() -> bool:
    return torch.cuda.is_available()


def _cuda_home() -> str | None:
    """The CUDA toolkit folder torch's extension builder will use (None when it finds none)."""
    from torch.utils import cpp_extension  # imported only here: it warns on machines without CUDA

    return cpp_extension.CUDA_HOME


def _ninja_available() -> bool:
    from torch.utils import cpp_extension

    return cpp_extension.is_ninja_available()


def _nvcc_release(nvcc: str) -> str | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"release (\d+)\.(\d+)", out)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def missing() -> str | None:
    """What this machine lacks to build and run the kernels, and what to do; None if nothing."""
    if not _gpu_seen():
        build = ("a CPU-only build: install a CUDA build of PyTorch if this machine has an NVIDIA GPU"
                 if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}")
        return (f"no CUDA GPU: PyTorch {torch.__version__} sees none ({build}). labkit's CUDA kernels "
                "need an NVIDIA GPU; run them on a GPU machine (on this one, notebook 06 shows the "
                "same algorithms in the Triton interpreter and on the CPU).")
    home = _cuda_home()
    nvcc = os.path.join(home, "bin", "nvcc") if home else None
    if nvcc is None or not os.path.exists(nvcc):
        where = f"looked in CUDA_HOME={home}" if home else "none on PATH, CUDA_HOME unset"
        return (f"no nvcc (the CUDA compiler) found ({where}). Install the CUDA toolkit "
                f"{torch.version.cuda} and put its bin/ folder on PATH, or set CUDA_HOME to the "
                "toolkit folder (the one holding bin/nvcc), then restart Python.")
    release = _nvcc_release(nvcc)
    if release and torch.version.cuda and release.split(".")[0] != torch.version.cuda.split(".")[0]:
        return (f"{nvcc} is CUDA {release} but PyTorch was built with CUDA {torch.version.cuda}: "
                f"set CUDA_HOME to a CUDA {torch.version.cuda.split('.')[0]}.x toolkit (or install one), "
                "then restart Python.")
    if not _ninja_available():
        return "ninja (the build tool torch uses for extensions) is missing: pip install ninja."
    return None


def require() -> None:
    """Raise `CudaUnavailable` unless this machine can build and run the kernels."""
    why = missing()
    if why is not None:
        raise CudaUnavailable(why)


# ---------------------------------------------------------------- building

def _arch_key() -> str:
    """The GPU architectures the build targets (torch builds for the visible GPUs by default)."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return env
    caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return ",".join(f"{a}.{b}" for a, b in sorted(caps))


def build_dir() -> Path:
    """The cache folder of this build: $LABKIT_CACHE/cuda/<hash of sources, torch, Python, GPU arch>."""
    from labkit.device import cache_dir

    h = hashlib.sha1()
    for name, text in sorted(sources().items()):
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    facts = [torch.__version__, str(torch.version.cuda), f"{sys.version_info[0]}.{sys.version_info[1]}"]
    if _gpu_seen():
        facts.append(_arch_key())
    h.update("|".join(facts).encode())
    return cache_dir() / "cuda" / h.hexdigest()[:16]


_module: ModuleType | None = None


def build(verbose: bool = False, reload: bool = False) -> tuple[ModuleType, float]:
    """Compile (or load from the cache) the extension; return it and the seconds this took.

    The first build on a machine compiles everything (tens of seconds: torch's headers are
    big); later builds, in this or another session, find the objects and return in about a
    second. Within a session the loaded module is reused (0 s) unless `reload=True`
    (then torch re-imports it without running ninja).
    """
    global _module
    if _module is not None and not reload:
        return _module, 0.0  # checked and built already: every kernel call comes through here
    require()
    from torch.utils import cpp_extension

    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        module = cpp_extension.load(
            name=f"labkit_cuda_{folder.name}",
            sources=[str(SOURCE_DIR / BINDING), *(str(SOURCE_DIR / f) for f in KERNEL_FILES)],
            extra_include_paths=[str(SOURCE_DIR)],
            extra_cflags=["-O2"],
            extra_cuda_cflags=["-O3", "-lineinfo"],
            build_directory=str(folder),
            verbose=verbose,
        )
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(f"building labkit's CUDA kernels in {folder} failed (build(verbose=True) "
                           f"shows every compiler command): {exc}") from exc
    seconds = time.perf_counter() - started
    _module = module
    return module, seconds


# ---------------------------------------------------------------- input checks

def _check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}: "
                        f"make one with torch.as_tensor({name}, dtype=torch.float32)")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} has dtype {t.dtype}: these CUDA kernels take torch.float32; "
                        f"convert it with {name}.float()")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}; "
                         f"a transpose or a strided slice?): pass {name}.contiguous()")


def check_vector_add(x, y) -> None:
    """Dtype, contiguity and shape checks of `vector_add` (the same on any machine)."""
    _check_tensor(x, "x")
    _check_tensor(y, "y")
    if x.shape != y.shape:
        raise ValueError(f"x has shape {tuple(x.shape)} but y has shape {tuple(y.shape)}: vector_add "
                         "needs equal shapes (broadcast first: y.expand_as(x).contiguous())")


def check_matmul(a, b) -> None:
    """Dtype, contiguity and shape checks of `matmul_naive` / `matmul_tiled`."""
    _check_tensor(a, "a")
    _check_tensor(b, "b")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a and b must be 2-D matrices; got a of shape {tuple(a.shape)} and b of "
                         f"shape {tuple(b.shape)} (for batches, loop or use torch.matmul)")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is {a.shape[0]} x {a.shape[1]} and b is {b.shape[0]} x {b.shape[1]}: "
                         "a's column count must equal b's row count")
    if max(a.shape[0], a.shape[1], b.shape[1]) > INT_MAX:
        raise ValueError("a matrix side is over 2^31 - 1: too large for these kernels")


def check_block_sum(x) -> None:
    """Dtype and contiguity checks of `block_sum` (any shape, any length)."""
    _check_tensor(x, "x")


def check_on_gpu(**tensors: torch.Tensor) -> None:
    """Every tensor on the same CUDA device, else a ValueError saying how to move them."""
    devices = set()
    for name, t in tensors.items():
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: these CUDA kernels take CUDA tensors; "
                             f"move it with {name}.cuda() (or make it with device='cuda')")
        devices.add(t.device)
    if len(devices) > 1:
        raise ValueError(f"the inputs are on different GPUs ({', '.join(map(str, sorted(devices, key=str)))}): "
                         "move them to one with .to(device)")


# ---------------------------------------------------------------- the kernels

def _ext(**tensors: torch.Tensor) -> ModuleType:
    module, _ = build()  # raises CudaUnavailable on a machine that cannot run them
    check_on_gpu(**tensors)
    return module


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y elementwise (float32, contiguous, equal shapes, on one GPU)."""
    check_vector_add(x, y)
    return _ext(x=x, y=y).vector_add(x, y)


def matmul_naive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with one thread per output element, every operand read from global memory."""
    check_matmul(a, b)
    return _ext(a=a, b=b).matmul_naive(a, b)


def matmul_tiled(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with 32 x 32 tiles of a and b staged through shared memory."""
    check_matmul(a, b)
    return _ext(a=a, b=b).matmul_tiled(a, b)


def block_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of all elements of x as a 0-d tensor (two passes of a block reduction)."""
    check_block_sum(x)
    return _ext(x=x).block_sum(x)
