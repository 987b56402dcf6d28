"""Shared test set-up: labkit decides the device (and the Triton interpreter) before any test imports triton."""
import os
import tempfile

os.environ.setdefault("LABKIT_CACHE", tempfile.mkdtemp(prefix="labkit-test-cache-"))
os.environ.setdefault("MPLBACKEND", "Agg")

import labkit  # noqa: E402

labkit.setup()


# --- Triton kernel tests (labkit/kernels) ---
import pytest  # noqa: E402
import torch  # noqa: E402

# bf16 keeps 8 significant bits: rounded to nearest, a result is within 2^-9 (0.2%) of exact; fp32 math inside a
# kernel adds a little. (Triton's interpreter truncated instead, one unit low in a quarter of elements; setup() fixes it.)
KERNEL_TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 6e-3}


@pytest.fixture
def poison_outputs(monkeypatch):
    """Make torch.empty / empty_like / empty_strided return NaN-filled floats, so unwritten output elements fail."""
    def poisoned(make):
        def wrapper(*args, **kwargs):
            t = make(*args, **kwargs)
            if t.is_floating_point():
                t.fill_(float("nan"))
            return t
        return wrapper
    for name in ("empty", "empty_like", "empty_strided"):
        monkeypatch.setattr(torch, name, poisoned(getattr(torch, name)))


@pytest.fixture
def close64():
    """assert_close against a float64 reference with a tolerance fit for `out`'s dtype."""
    def check(out, ref, dtype=None, scale=1.0):
        tol = KERNEL_TOL[dtype or out.dtype] * scale
        assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
        assert not torch.isnan(out).any(), "output holds NaN (an element left unwritten?)"
        torch.testing.assert_close(out.double(), ref.double(), rtol=tol, atol=tol)
    return check
