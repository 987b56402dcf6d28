"""labkit.kernels.matmul against a float64 reference (interpreter on the CPU)."""
import pytest
import torch

import labkit
from labkit import kernels

DEV = labkit.current().device


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEV).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matmul_matches_float64(dtype, poison_outputs, close64):
    for m, k, n in [(37, 53, 29), (5, 70, 33)]:
        a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
        c = kernels.matmul(a, b)
        assert c.dtype == dtype and c.shape == (m, n)
        # Each output sums k products: allow the error to grow like sqrt(k) roundings.
        close64(c, a.double() @ b.double(), scale=3)


def test_matmul_transposed_and_sliced_inputs(poison_outputs, close64):
    a = randn(45, 33).t()  # (33, 45), column-major
    b = randn(50, 60)[3:48, 7:40]  # (45, 33), strided
    close64(kernels.matmul(a, b), a.double() @ b.double(), scale=3)


def test_matmul_follows_the_tf32_flag(close64):
    from labkit.kernels.matmul import input_precision
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert input_precision(torch.float32) == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = False
        assert input_precision(torch.float32) == "ieee"
        assert input_precision(torch.bfloat16) == "tf32"
        # TF32 off: fp32 inputs take the exact path, within fp32 rounding of float64.
        a, b = randn(40, 64), randn(64, 24)
        close64(kernels.matmul(a, b), a.double() @ b.double(), scale=3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_matmul_bad_inputs():
    a = randn(4, 5)
    with pytest.raises(ValueError, match=r"a is \(4, 5\), so b must have shape \(5, N\); got \(6, 3\)"):
        kernels.matmul(a, randn(6, 3))
    with pytest.raises(ValueError, match="2-D"):
        kernels.matmul(randn(2, 4, 5), randn(5, 3))
    with pytest.raises(TypeError, match="float64.*accepted"):
        kernels.matmul(a.double(), randn(5, 3).double())
    with pytest.raises(TypeError, match="share one dtype"):
        kernels.matmul(a, randn(5, 3, dtype=torch.float16))


def test_matmul_counts():
    assert kernels.matmul.flops(2, 3, 4) == 48
    assert kernels.matmul.min_bytes(2, 3, 4, torch.bfloat16) == (8 + 12 + 6) * 2
