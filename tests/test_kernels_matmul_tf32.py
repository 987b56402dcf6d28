"""labkit.kernels.matmul_tf32 (the Gluon TF32 kernel): when matmul takes it, its results against float64
(a Hopper GPU), and what it compiles to for sm_90 (here, no GPU needed)."""
import math

import pytest
import torch

import labkit
from labkit import kernels

DEV = labkit.current().device
mm = kernels.modules()["matmul"]
HOPPER = DEV.type == "cuda" and torch.cuda.get_device_capability()[0] == 9
gluon_gpu = pytest.mark.skipif(not HOPPER or mm.matmul_tf32 is None,
                               reason="the Gluon TF32 kernel runs on a Hopper GPU (sm_90) with a Triton that has Gluon")


@pytest.fixture
def tf32(monkeypatch):
    """TF32 on (restored afterwards); small products take the tensor-core paths on a GPU too."""
    monkeypatch.setattr(mm, "TMA_MIN_MNK", {2: 0, 4: 0})
    monkeypatch.setattr(mm, "_plans", {})
    old = torch.backends.cuda.matmul.allow_tf32  # (not an attribute monkeypatch can set)
    torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def check_tf32(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """c against a @ b in float64, for inputs of unit scale: TF32 keeps 10 mantissa bits of each input, so an
    output's error is a sum of K small random terms: about 2^-10 sqrt(K); allow 2^-7 sqrt(K) (one product left
    out or counted twice is an error of order 1, far above it)."""
    ref = mm.matmul_tf32.reference(a.double(), b.double())
    assert c.shape == ref.shape and c.dtype == torch.float32
    assert not torch.isnan(c).any(), "output holds NaN (an element left unwritten?)"
    err = (c.double() - ref).abs().max().item()
    assert err <= 2**-7 * math.sqrt(a.shape[1]), f"max error {err:.3g} for K = {a.shape[1]}"


@pytest.mark.skipif(DEV.type != "cpu", reason="the interpreter runs on the CPU")
def test_gluon_path_never_in_the_interpreter(tf32):
    a, b = torch.randn(37, 40), torch.randn(40, 72)  # the TMA kernel on a K-major copy of b instead
    assert mm.plan(a, b)[:3] == ("tma", True, True)


@gluon_gpu
def test_gluon_path_matches_float64(tf32, monkeypatch, poison_outputs):
    monkeypatch.setattr(mm, "transpose", lambda x: pytest.fail("the Gluon path copied b"))
    # M, N, K not multiples of the tiles (256 x 128 x 32); an odd number of k-steps (K = 520: 17); tiles
    # smaller than the matrices' edges (N = 8, K = 4); more tiles than SMs
    for m, k, n in [(37, 40, 72), (1000, 520, 1032), (64, 4, 8), (3000, 1036, 2996), (2048, 2048, 2048)]:
        a, b = torch.randn(m, k, device=DEV), torch.randn(k, n, device=DEV)
        assert mm.plan(a, b)[:3] == ("gluon", False, False), (m, k, n)
        check_tf32(kernels.matmul(a, b), a, b)


@gluon_gpu
def test_gluon_path_takes_views_and_every_tile_config(tf32, poison_outputs):
    # row strides of 80 and 96 elements (16-byte multiples), first elements 16-byte aligned
    a = torch.randn(600, 80, device=DEV)[8:590, 8:48]
    b = torch.randn(48, 96, device=DEV)[4:44, 16:88]
    assert not a.is_contiguous() and not b.is_contiguous()
    assert mm.plan(a, b).path == "gluon"
    check_tf32(kernels.matmul(a, b), a, b)
    # each size's tiles (the 8192 ones differ in stages), on one modest product
    a, b = torch.randn(700, 264, device=DEV), torch.randn(264, 392, device=DEV)
    for size in mm.matmul_tf32.CONFIGS:
        c = torch.empty(700, 392, device=DEV)
        mm.matmul_tf32.matmul_tf32(a, b, c, size)
        check_tf32(c, a, b)


@gluon_gpu
def test_other_inputs_leave_the_gluon_path(tf32, monkeypatch, poison_outputs, close64):
    a, b = torch.randn(37, 40, device=DEV), torch.randn(40, 72, device=DEV)
    cases = {  # K-major b: the TMA kernel reads it as it is; b's first element not 16-byte aligned: copied
        "b K-major": (a, torch.randn(72, 40, device=DEV).t(), ("tma", False, True)),
        "b misaligned": (a, torch.randn(2881, device=DEV)[1:].view(40, 72), ("tma", True, True)),
    }
    for what, (x, y, plan) in cases.items():
        assert mm.plan(x, y)[:3] == plan, what
        check_tf32(kernels.matmul(x, y), x, y)
    monkeypatch.setattr(mm, "TF32_GLUON", False)
    assert mm.plan(a, b)[:3] == ("tma", True, True)
    torch.backends.cuda.matmul.allow_tf32 = False  # full fp32: no tensor cores (the fixture restores it)
    assert mm.plan(a, b).path == "pointer"
    close64(kernels.matmul(a, b), a.double() @ b.double(), scale=3)

# The kernel's compile for sm_90a (no GPU needed) is checked in tests/test_compat.py, in a fresh process.
