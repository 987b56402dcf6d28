"""labkit's Triton kernels: each module holds the byte/FLOP count, a PyTorch reference, the kernel
and a checked wrapper. Importing this package runs labkit's set-up first (if it has not run), so on
a machine without a GPU the kernels are defined for the Triton interpreter and take CPU tensors.

A kernel is one line of `KERNELS`: everything else here (the imports, `kernels.NAME`, its attributes,
`BENCHMARKED` and `modules()`) is derived from it.
"""
import importlib
from types import ModuleType

from labkit.device import current as _current

_current()  # before triton is imported: decides TRITON_INTERPRET

# kernel module (labkit/kernels/<module>.py) -> the public callable it exports, in the order `labkit bench` times them
KERNELS: dict[str, str] = {
    "vector_add": "vector_add",
    "bias_gelu": "bias_gelu",
    "softmax": "softmax",
    "layer_norm": "layer_norm",
    "adam": "TritonAdamW",
    "matmul": "matmul",
    "attention": "attention",
}
ATTRIBUTES = ("reference", "min_bytes", "flops")  # each function carries its module's counts and reference
# A kernel's bench cases (bench_cases(), labkit/kernels/_bench.py) end its own module, or live in the module
# named here when they bring a harness of their own.
BENCH_MODULES: dict[str, str] = {"attention": "attention_bench", "layer_norm": "layer_norm_bench"}

_modules: dict[str, ModuleType] = {}
for _module, _public in KERNELS.items():
    _mod = _modules[_module] = importlib.import_module(f"labkit.kernels.{_module}")
    _obj = getattr(_mod, _public)
    if not isinstance(_obj, type):  # kernels.softmax is the function; kernels.softmax.min_bytes(...) its count
        for _attr in ATTRIBUTES:
            if hasattr(_mod, _attr):
                setattr(_obj, _attr, getattr(_mod, _attr))
    globals()[_public] = _obj  # a function replaces its module's name here; a class (TritonAdamW) sits beside it

# Kernel name -> the module whose bench_cases() `labkit bench` times, in KERNELS' order.
BENCHMARKED: dict[str, ModuleType] = {}
for _module in KERNELS:
    _bench_mod = importlib.import_module(f"labkit.kernels.{BENCH_MODULES.get(_module, _module)}")
    if hasattr(_bench_mod, "bench_cases"):
        BENCHMARKED[_module] = _bench_mod

__all__ = [*KERNELS.values(), "KERNELS", "modules", "BENCHMARKED"]


def modules() -> dict[str, ModuleType]:
    """Each kernel's module (its min_bytes, flops, reference...), by kernel name."""
    return dict(_modules)
