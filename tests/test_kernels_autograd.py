"""vector_add, softmax and matmul keep the autograd graph: gradients match float64 references."""
import pytest
import torch

import labkit
from labkit import kernels

DEV = labkit.current().device
DTYPES = [torch.float32, torch.bfloat16]


def leaf(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEV).to(dtype).requires_grad_()


def grads64(fn, *inputs, dy):
    """Gradients of sum(fn(inputs) * dy) in float64."""
    x64 = [t.detach().double().requires_grad_() for t in inputs]
    return torch.autograd.grad(fn(*x64), x64, dy.double())


@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_add_backward(dtype, close64):
    x, y = leaf(5, 129, dtype=dtype), leaf(129, 5, dtype=dtype).t()  # y non-contiguous
    z = kernels.vector_add(x, y)
    assert z.requires_grad and z.grad_fn is not None
    dz = torch.randn_like(z)
    dx, dy = torch.autograd.grad(z, (x, y), dz)
    for got, ref in zip((dx, dy), grads64(lambda a, b: a + b, x, y, dy=dz)):
        close64(got, ref)


def test_vector_add_grad_for_one_input_only(close64):
    x, y = leaf(37), torch.randn(37, device=DEV)
    kernels.vector_add(x, y).sum().backward()
    close64(x.grad, torch.ones(37, dtype=torch.float64, device=DEV))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("online", [False, True])
def test_softmax_backward(dtype, online, close64):
    x = leaf(3, 7, 129, dtype=dtype)
    y = kernels.softmax(x, online=online)
    assert y.requires_grad
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, (x,), dy)
    (ref,) = grads64(lambda t: torch.softmax(t, -1), x, dy=dy)
    close64(dx, ref, scale=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_backward(dtype, close64):
    a = leaf(37, 53, dtype=dtype)
    b = leaf(29, 53, dtype=dtype).t()  # (53, 29), transposed view
    c = kernels.matmul(a, b)
    assert c.requires_grad
    dc = torch.randn_like(c)
    da, db = torch.autograd.grad(c, (a, b), dc)
    for got, ref in zip((da, db), grads64(torch.matmul, a, b, dy=dc)):
        assert got.dtype == dtype
        close64(got, ref, scale=3)


def test_matmul_grad_through_a_loss_and_one_frozen_input(close64):
    a, b = leaf(9, 17), torch.randn(17, 5, device=DEV)
    kernels.matmul(a, b).pow(2).sum().backward()
    a64 = a.detach().double().requires_grad_()
    (a64 @ b.double()).pow(2).sum().backward()
    close64(a.grad, a64.grad, scale=3)


def test_no_graph_is_built_without_grad():
    x = torch.randn(33, device=DEV)
    assert kernels.vector_add(x, x).grad_fn is None
    with torch.no_grad():
        assert kernels.softmax(leaf(4, 9)).grad_fn is None
