"""toy_scale against a float64 reference: odd sizes, a transposed view, every accepted dtype."""
import pytest
import torch

import labkit
from labkit import kernels

DEV = labkit.current().device  # where labkit's Triton kernels run: the GPU, or the interpreter on the CPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_toy_scale_matches_float64(dtype, close64):
    x = torch.randn(37, 5, dtype=dtype, device=DEV).t()
    close64(kernels.toy_scale(x), x.double() * 2, dtype)
