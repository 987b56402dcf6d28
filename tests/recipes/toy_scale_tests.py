"""toy_scale against a float64 reference: odd sizes, a transposed view, every accepted dtype."""
import pytest
import torch

from labkit import kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_toy_scale_matches_float64(dtype, close64):
    x = torch.randn(37, 5, dtype=dtype).t()
    close64(kernels.toy_scale(x), x.double() * 2, dtype)
