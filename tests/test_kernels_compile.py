"""labkit's softmax, layer norm and bias+GELU as custom ops: torch.compile(fullgraph=True) takes a block using all
three with no graph break, and its values and gradients match eager labkit and a float64 reference."""
import pytest
import torch

import labkit
from labkit import kernels
from labkit.kernels import ops

DEV = labkit.current().device
# Inductor on the CPU needs a C++ toolchain and minutes of compiling: GPU only (the GPU script runs it)
BACKENDS = ["aot_eager"] + (["inductor"] if labkit.current().is_gpu else [])


def _block(sm, ln, bg):
    def block(x, w, b, bias):
        return sm(bg(ln(x, w, b), bias) * 0.5)
    return block


def _reference(x, w, b, bias):
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
    return torch.softmax(torch.nn.functional.gelu(h + bias, approximate="tanh") * 0.5, dim=-1)


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 33, generator=g)[:, ::2]  # odd sizes, a non-contiguous view
    made = (x, torch.randn(33, generator=g), torch.randn(33, generator=g), torch.randn(33, generator=g))
    return tuple(t.to(DEV, dtype) for t in made)


def test_custom_ops_pass_torch_library_opcheck():
    x, w, b, bias = (t.clone().requires_grad_(True) for t in _inputs())
    torch.library.opcheck(torch.ops.labkit.softmax.default, (x.detach().requires_grad_(True),))
    torch.library.opcheck(torch.ops.labkit.layer_norm_fwd.default, (x, w, b, 1e-5))
    torch.library.opcheck(torch.ops.labkit.bias_gelu.default, (x, bias))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_block_of_all_three_compiles_fullgraph_with_eager_gradients(backend, dtype):
    torch._dynamo.reset()
    leaves = [t.clone().requires_grad_(True) for t in _inputs(1, dtype)]
    compiled = torch.compile(_block(ops.softmax, ops.layer_norm, ops.bias_gelu), fullgraph=True, backend=backend)
    y = compiled(*leaves)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, dy)
    eager_leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    y_eager = _block(kernels.softmax, kernels.layer_norm, kernels.bias_gelu)(*eager_leaves)
    eager_grads = torch.autograd.grad(y_eager, eager_leaves, dy)
    ref_leaves = [t.detach().double().requires_grad_(True) for t in leaves]
    y_ref = _reference(*ref_leaves)
    ref_grads = torch.autograd.grad(y_ref, ref_leaves, dy.double())
    fp32 = dtype == torch.float32  # bf16: the block rounds between ops (8 bits of mantissa)
    # the same kernels, compiled or not: equal under aot_eager; Inductor may fuse the torch ops between them
    # (softmax's backward) in another order, a rounding step of bf16 (2^-8) apart
    same = dict(rtol=1e-5, atol=1e-6) if fp32 else dict(rtol=0, atol=0) if backend == "aot_eager" else dict(
        rtol=2**-7, atol=2**-7)
    ref_tol = dict(rtol=1e-4, atol=1e-5) if fp32 else dict(rtol=0.05, atol=0.02)
    torch.testing.assert_close(y, y_eager, **same)
    torch.testing.assert_close(y.double(), y_ref, **ref_tol)
    for got, eager, ref in zip(grads, eager_grads, ref_grads):
        torch.testing.assert_close(got, eager, **same)
        torch.testing.assert_close(got.double(), ref, **(ref_tol if fp32 else dict(rtol=0.05, atol=0.05)))


def test_the_compiled_graph_has_the_three_ops_and_no_break():
    torch._dynamo.reset()
    explained = torch._dynamo.explain(_block(ops.softmax, ops.layer_norm, ops.bias_gelu))(*_inputs(2))
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    code = explained.graphs[0].code
    assert all(f"labkit.{name}" in code for name in ("softmax", "layer_norm_fwd", "bias_gelu"))


def test_bad_input_gets_the_eager_message():
    with pytest.raises(ValueError, match="bias must have shape"):
        ops.bias_gelu(torch.randn(3, 4, device=DEV), torch.randn(5, device=DEV))
    with pytest.raises(TypeError, match="accepted: float32"):
        ops.softmax(torch.ones(3, dtype=torch.int64, device=DEV))
