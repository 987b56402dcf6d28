"""labkit's Triton kernels: each module holds the byte/FLOP count, a PyTorch reference, the kernel
and a checked wrapper. Importing this package runs labkit's set-up first (if it has not run), so on
a machine without a GPU the kernels are defined for the Triton interpreter and take CPU tensors.
"""
from labkit.device import current as _current

_current()  # before triton is imported: decides TRITON_INTERPRET

from labkit.kernels import adam, attention as _attention_mod  # noqa: E402
from labkit.kernels import bias_gelu as _bias_gelu_mod, layer_norm as _layer_norm_mod  # noqa: E402
from labkit.kernels import matmul as _matmul_mod, softmax as _softmax_mod, vector_add as _vector_add_mod  # noqa: E402
from labkit.kernels.adam import TritonAdamW  # noqa: E402
from labkit.kernels.attention import attention  # noqa: E402
from labkit.kernels.bias_gelu import bias_gelu  # noqa: E402
from labkit.kernels.layer_norm import layer_norm  # noqa: E402
from labkit.kernels.matmul import matmul  # noqa: E402
from labkit.kernels.softmax import softmax  # noqa: E402
from labkit.kernels.vector_add import vector_add  # noqa: E402

# `kernels.softmax` is the function, and also carries its module's counts and reference:
# kernels.softmax.min_bytes(...), kernels.softmax.reference(...) (likewise for the others).
for _name, _mod in (("vector_add", _vector_add_mod), ("bias_gelu", _bias_gelu_mod), ("softmax", _softmax_mod),
                    ("layer_norm", _layer_norm_mod), ("matmul", _matmul_mod),
                    ("attention", _attention_mod)):
    for _attr in ("reference", "min_bytes", "flops"):
        setattr(getattr(_mod, _name), _attr, getattr(_mod, _attr))

__all__ = ["vector_add", "bias_gelu", "softmax", "layer_norm", "TritonAdamW", "matmul", "attention", "modules",
           "BENCHMARKED"]

# The kernel modules `labkit bench` times, in order: each offers bench_cases() (labkit/kernels/_bench.py).
BENCHMARKED = [_vector_add_mod, _bias_gelu_mod, _softmax_mod, _layer_norm_mod, adam, _matmul_mod, _attention_mod]


def modules() -> dict:
    """Each kernel's module (its min_bytes, flops, reference...), by kernel name."""
    return {"vector_add": _vector_add_mod, "bias_gelu": _bias_gelu_mod, "softmax": _softmax_mod,
            "layer_norm": _layer_norm_mod, "adam": adam, "matmul": _matmul_mod,
            "attention": _attention_mod}
