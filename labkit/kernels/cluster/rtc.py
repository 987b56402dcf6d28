"""CUDA kernels compiled at run time with NVRTC, through PyTorch (no nvcc, no ninja, no build folder).

For kernels a Triton program cannot express: softmax_cluster.cu and layer_norm_bwd_cluster.cu share rows
between the blocks of a Hopper thread-block cluster (helpers in cluster.cuh). NVRTC ships with PyTorch's CUDA
builds; where this PyTorch or GPU cannot compile or run a kernel, `compile_kernel` raises, `cluster_kernel`
warns once and returns None, and callers take their Triton path instead.
"""
from __future__ import annotations

import ctypes
import functools
import threading
import warnings
from pathlib import Path

import torch

from labkit import compat
from labkit.device import gpu_index

SOURCE_DIR = Path(__file__).resolve().parent
# CUfunction_attribute values: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (dynamic shared memory past
# 48 KB) and CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED (clusters of more than 8 blocks).
_MAX_DYNAMIC_SHARED, _NON_PORTABLE_CLUSTER = 8, 14
MAX_CLUSTER = 16  # blocks a cluster may have on Hopper (more than 8 with the non-portable attribute)
ELEM = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # the element types of cluster.cuh (-D ELEM=...)


@functools.lru_cache(maxsize=None)
def _driver() -> ctypes.CDLL:
    """The CUDA driver library (labkit.compat.cuda_driver), with cuLaunchKernel's argument types set once."""
    lib = compat.cuda_driver()
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_void_p]
    return lib


class Kernel:
    """A kernel compiled by `compile_kernel` for one GPU: kernel(grid, block, *args) launches grid x block
    threads (1-D), with `shared` bytes of dynamic shared memory a block, on that GPU's current stream; tensors
    pass as their data pointers, ints as 32-bit ints.

    It launches through PyTorch's C++ static launcher where this PyTorch has one (the launcher labkit's Triton
    kernels take). Else the argument values are written into ctypes slots made at the first call (and again only
    when the kinds of the arguments change), which the driver reads through one fixed array of pointers: no
    ctypes objects per call (issue 39: the host path). A lock keeps two threads from filling the slots at once."""

    def __init__(self, func: ctypes.c_void_p, device_index: int, shared: int = 0):
        self.func, self.device_index, self.shared = func, device_index, shared
        handle = getattr(func, "value", func)  # the CUfunction as an integer, for PyTorch's static launcher
        self.handle = handle if isinstance(handle, int) else None
        self._codes: dict[tuple, str] = {}  # its argument codes ("O" a pointer, "i" an int32) by kinds of arguments
        self._lock = threading.Lock()
        self._kinds: tuple = ()
        self._slots: list = []
        self._pointers = None

    def _make_slots(self, kinds: tuple) -> None:
        self._slots = [ctypes.c_void_p() if tensor else ctypes.c_int() for tensor in kinds]
        self._pointers = (ctypes.c_void_p * len(kinds))(*map(ctypes.addressof, self._slots))
        self._kinds = kinds

    def __call__(self, grid: int, block: int, *args: torch.Tensor | int) -> None:
        if _current_device() != self.device_index:
            with torch.cuda.device(self.device_index):
                return self(grid, block, *args)
        kinds = tuple(isinstance(a, torch.Tensor) for a in args)
        if _static_launch is not None and self.handle is not None and block % 32 == 0:
            # PyTorch's C++ launcher, as labkit's Triton launches take (issue 39: a few us a call fewer than ctypes)
            codes = self._codes.get(kinds)
            if codes is None:
                codes = self._codes[kinds] = "".join("O" if tensor else "i" for tensor in kinds)
            _static_launch(self.handle, grid, 1, 1, block // 32, self.shared, codes,
                           tuple(a.data_ptr() if tensor else a for a, tensor in zip(args, kinds)),
                           compat.current_raw_stream(self.device_index))
            return
        with self._lock:
            if kinds != self._kinds:
                self._make_slots(kinds)
            for slot, a, tensor in zip(self._slots, args, kinds):
                slot.value = a.data_ptr() if tensor else a
            error = _driver().cuLaunchKernel(self.func, grid, 1, 1, block, 1, 1, self.shared,
                                             compat.current_raw_stream(self.device_index), self._pointers, None)
        if error:
            compat.check_cuda(error)


_current_device = compat.current_device_fn()
_static_launch = compat.static_cuda_launch()


@functools.lru_cache(maxsize=None)
def compile_kernel(file: str, name: str, device_index: int, shared: int = 0, **defines: int) -> Kernel:
    """The kernel `name` of labkit/kernels/cluster/`file` (which may include cluster.cuh) compiled with
    `-D key=value` for each of `defines`, loaded on GPU `device_index`, launched with `shared` bytes of dynamic
    shared memory."""
    compile_ = compat.nvrtc_compile()
    if compile_ is None:
        raise RuntimeError(f"PyTorch {torch.__version__} has no torch.cuda._compile_kernel (NVRTC): "
                           "PyTorch 2.8 or later has it")
    with torch.cuda.device(device_index):
        kernel = compile_((SOURCE_DIR / file).read_text(), name, cuda_include_dirs=[str(SOURCE_DIR)],
                          nvcc_options=[f"-D{k}={v}" for k, v in defines.items()])
        if defines.get("CLUSTER", 0) > 8:
            compat.check_cuda(_driver().cuFuncSetAttribute(kernel.func, _NON_PORTABLE_CLUSTER, 1))
        if shared:
            compat.check_cuda(_driver().cuFuncSetAttribute(kernel.func, _MAX_DYNAMIC_SHARED, shared))
    return Kernel(kernel.func, device_index, shared)


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


def max_active_clusters(kernel: Kernel, cluster: int, threads: int) -> int:
    """How many clusters of `kernel` (its cluster size set at compile time) the GPU holds at once."""
    config = _LaunchConfig((ctypes.c_uint * 3)(cluster, 1, 1), (ctypes.c_uint * 3)(threads, 1, 1), kernel.shared, None,
                           None, 0)
    count = ctypes.c_int()
    compat.check_cuda(_driver().cuOccupancyMaxActiveClusters(ctypes.byref(count), kernel.func, ctypes.byref(config)))
    return count.value


@functools.lru_cache(maxsize=None)
def has_clusters(device_index: int) -> bool:
    """Whether GPU `device_index` runs thread-block clusters (Hopper, sm_90, or newer)."""
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def cluster_index(device: torch.device) -> int | None:
    """The index of `device` where it is a GPU that runs thread-block clusters, else None."""
    if device.type != "cuda":
        return None
    index = gpu_index(device)
    return index if has_clusters(index) else None


def vector_rows(t: torch.Tensor) -> bool:
    """Whether the rows of 2-D `t` are whole 16-byte vectors (width, stride and start) with a stride a 32-bit
    count of vectors can hold, as the cluster kernels read them."""
    size = t.element_size()
    return not (t.stride(-1) != 1 or (t.shape[-1] * size) % 16 or (t.stride(0) * size) % 16 or t.data_ptr() % 16
                or t.stride(0) * size >= 2**35)


@functools.lru_cache(maxsize=None)
def cluster_kernel(op: str, file: str, name: str, device_index: int, shared: int = 0,
                   **defines: int) -> tuple[Kernel, int] | None:
    """(kernel, clusters the GPU holds at once) for a kernel whose defines include CLUSTER and THREADS, with
    `shared` bytes of dynamic shared memory a block; None, with a warning (once) naming `op`, where it cannot be
    compiled or launched here."""
    try:
        kernel = compile_kernel(file, name, device_index, shared, **defines)
        with torch.cuda.device(device_index):
            resident = max_active_clusters(kernel, defines["CLUSTER"], defines["THREADS"])
        if resident < 1:
            raise RuntimeError(f"a cluster of {defines['CLUSTER']} blocks of {defines['THREADS']} threads does not "
                               "fit on this GPU")
    except Exception as exc:  # no NVRTC library, a driver without clusters...
        warnings.warn(f"{op}: long rows take the Triton kernel (slower) because the cluster kernel cannot run "
                      f"here: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=4)
        return None
    return kernel, resident
