"""labkit's softmax, layer norm and bias+GELU as PyTorch custom ops (labkit::softmax, labkit::layer_norm_fwd, ...),
which torch.compile sees as single nodes with fake-tensor shapes and autograd: a block that calls them compiles
with fullgraph=True, no graph break, and Inductor can fuse the work around them.

Eager code keeps calling labkit.kernels.softmax & co. directly: the same kernels without the dispatcher's
per-call cost (see issue 39). Use these where a model is compiled. Inputs are checked when traced as in eager.
"""
from __future__ import annotations

import importlib

import torch

_softmax = importlib.import_module("labkit.kernels.softmax")
_layer_norm = importlib.import_module("labkit.kernels.layer_norm")
_bias_gelu = importlib.import_module("labkit.kernels.bias_gelu")
_dequant_matvec = importlib.import_module("labkit.kernels.dequant_matvec")
from labkit.kernels._common import check_inputs, check_tensor  # noqa: E402


@torch.library.custom_op("labkit::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor) -> torch.Tensor:
    return _softmax._softmax(x)


@_softmax_op.register_fake
def _(x):
    return x.new_empty(x.shape)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    y32, dy32 = y.float(), dy.float()
    return (y32 * (dy32 - (dy32 * y32).sum(dim=-1, keepdim=True))).to(y.dtype)


_softmax_op.register_autograd(_softmax_backward, setup_context=_softmax_setup)


@torch.library.custom_op("labkit::layer_norm_fwd", mutates_args=())
def _layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, mean, rstd = _layer_norm.layer_norm_forward(x, weight, bias, eps)
    return y, mean, rstd


@_layer_norm_fwd.register_fake
def _(x, weight, bias, eps):
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return x.new_empty(x.shape), x.new_empty(rows, dtype=torch.float32), x.new_empty(rows, dtype=torch.float32)


@torch.library.custom_op("labkit::layer_norm_bwd", mutates_args=())
def _layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                    rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight and dbias stacked (2, N)): outputs of a custom op may not alias each other."""
    return _layer_norm.layer_norm_backward(dy, x, weight, mean, rstd, stacked=True)


@_layer_norm_bwd.register_fake
def _(dy, x, weight, mean, rstd):
    return x.new_empty(x.shape), weight.new_empty((2, *weight.shape))


def _layer_norm_setup(ctx, inputs, output):
    x, weight, _, _ = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])


def _layer_norm_backward(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dwb = _layer_norm_bwd(dy, x, weight, mean, rstd)
    return dx, dwb[0], dwb[1], None


_layer_norm_fwd.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup)


@torch.library.custom_op("labkit::bias_gelu", mutates_args=())
def _bias_gelu_op(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return _bias_gelu.bias_gelu_forward(x, bias)


@_bias_gelu_op.register_fake
def _(x, bias):
    return x.new_empty(x.shape)


@torch.library.custom_op("labkit::bias_gelu_bwd", mutates_args=())
def _bias_gelu_bwd(dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _bias_gelu.bias_gelu_backward(dy, x, bias)


@_bias_gelu_bwd.register_fake
def _(dy, x, bias):
    return x.new_empty(x.shape), bias.new_empty(bias.shape)


def _bias_gelu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _bias_gelu_backward(ctx, dy):
    x, bias = ctx.saved_tensors
    return _bias_gelu_bwd(dy, x, bias)


_bias_gelu_op.register_autograd(_bias_gelu_backward, setup_context=_bias_gelu_setup)


@torch.library.custom_op("labkit::dequant_matvec", mutates_args=())
def dequant_matvec(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """labkit.kernels.dequant_matvec (a few rows of x times one-byte weights; no autograd) as labkit::dequant_matvec."""
    return _dequant_matvec.dequant_matvec(x, q, scale, bias)


@dequant_matvec.register_fake
def _(x, q, scale, bias):
    return x.new_empty((*x.shape[:-1], q.shape[0]))


def softmax(x: torch.Tensor) -> torch.Tensor:
    """labkit.kernels.softmax (one-pass/split choice automatic) as the custom op labkit::softmax."""
    check_tensor("softmax", "x", x)
    if x.dim() == 0:
        raise ValueError("softmax: x must have at least one dimension; got a 0-d tensor (use x.reshape(1)).")
    return _softmax_op(x)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """labkit.kernels.layer_norm as the custom ops labkit::layer_norm_fwd / layer_norm_bwd."""
    check_inputs("layer_norm", x=x, weight=weight, bias=bias)
    N = x.shape[-1] if x.dim() else 0
    if (x.dim() == 0 or weight.dim() != 1 or weight.shape[0] != N or bias.dim() != 1 or bias.shape[0] != N
            or N > _layer_norm.MAX_COLS):  # (ints: a Size compare costs microseconds)
        raise ValueError(f"layer_norm: x must have 1 to {_layer_norm.MAX_COLS} columns and weight and bias shape "
                         f"(x.shape[-1],); got x {tuple(x.shape)}, weight {tuple(weight.shape)}, bias "
                         f"{tuple(bias.shape)}.")
    return _layer_norm_fwd(x, weight.contiguous(), bias.contiguous(), float(eps))[0]


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """labkit.kernels.bias_gelu as the custom ops labkit::bias_gelu / bias_gelu_bwd."""
    _bias_gelu.check_inputs(x, bias)
    return _bias_gelu_op(x, bias.contiguous())
