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


# ---- the TMA path (matmul_tma_kernel): the interpreter takes it for every input TMA can describe ----
mm = kernels.modules()["matmul"]
# M, K, N: not multiples of the tiles (the interpreter's are 32); rows of 40 and 72 elements are whole
# 16-byte units in every dtype, as TMA needs. 9 tiles on 4 programs: each program loops over several.
TMA_SIZES = [(37, 40, 72), (70, 64, 96)]
PRECISIONS = [(torch.float32, True), (torch.float16, False), (torch.bfloat16, False)]  # tensor-core precisions


@pytest.fixture
def tf32_flag(monkeypatch):
    """Set torch's TF32 flag (restored afterwards); small products take the TMA path on a GPU too, and TF32 takes
    it rather than the Gluon kernel (tested in test_kernels_matmul_tf32.py)."""
    monkeypatch.setattr(mm, "TMA_MIN_MNK", {2: 0, 4: 0})  # on a GPU, products below it keep the pointer kernel
    monkeypatch.setattr(mm, "TF32_GLUON", False)
    monkeypatch.setattr(mm, "_plans", {})
    old = torch.backends.cuda.matmul.allow_tf32
    yield lambda on: setattr(torch.backends.cuda.matmul, "allow_tf32", on)
    torch.backends.cuda.matmul.allow_tf32 = old


def _tol(dtype, tf32):
    """The tolerance's dtype: TF32 keeps 10 mantissa bits (like fp16) on a GPU; the interpreter is exact fp32."""
    return torch.float16 if tf32 and dtype == torch.float32 and DEV.type == "cuda" else dtype


@pytest.mark.parametrize("dtype,tf32", PRECISIONS)
def test_matmul_tma_path_matches_float64(dtype, tf32, tf32_flag, poison_outputs, close64):
    tf32_flag(tf32)
    for m, k, n in TMA_SIZES:
        a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
        p = mm.plan(a, b)
        # TF32 takes B only K-major: a row-major b is copied by transpose() first
        assert (p.path, p.copy_b, p.b_kmajor) == ("tma", tf32, tf32)
        c = kernels.matmul(a, b)
        assert c.dtype == dtype and c.shape == (m, n)
        close64(c, a.double() @ b.double(), dtype=_tol(dtype, tf32), scale=3)


@pytest.mark.parametrize("dtype,tf32", PRECISIONS)
def test_matmul_tma_path_takes_views(dtype, tf32, tf32_flag, monkeypatch, poison_outputs, close64):
    tf32_flag(tf32)
    # b K-major (a transposed view): described as B^T, never copied, in any precision
    with monkeypatch.context() as m:
        m.setattr(mm, "transpose", lambda x: pytest.fail("a K-major b was copied"))
        a, b = randn(37, 40, dtype=dtype), randn(72, 40, dtype=dtype).t()
        p = mm.plan(a, b)
        assert (p.path, p.copy_b, p.b_kmajor) == ("tma", False, True)
        close64(kernels.matmul(a, b), a.double() @ b.double(), dtype=_tol(dtype, tf32), scale=3)
    # sliced views whose first element and row stride are 16-byte aligned
    a = randn(50, 80, dtype=dtype)[8:45, 8:48]  # (37, 40), row stride 80
    b = randn(48, 96, dtype=dtype)[4:44, 16:88]  # (40, 72), row stride 96
    assert not a.is_contiguous() and not b.is_contiguous()
    assert mm.plan(a, b).path == "tma"
    close64(kernels.matmul(a, b), a.double() @ b.double(), dtype=_tol(dtype, tf32), scale=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matmul_falls_back_to_the_pointer_kernel(dtype, tf32_flag, poison_outputs, close64):
    tf32_flag(True)  # fp32 on tensor cores: the TMA path unless the inputs rule it out
    a, b = randn(37, 40, dtype=dtype), randn(40, 72, dtype=dtype)
    cases = {
        "a transposed (not row-major)": (randn(40, 37, dtype=dtype).t(), b),
        "N = 53: C's rows are not whole 16-byte units": (a, randn(40, 53, dtype=dtype)),
        "K = 29: A's rows are not whole 16-byte units": (randn(37, 29, dtype=dtype), randn(29, 72, dtype=dtype)),
    }
    if dtype != torch.float32:  # (TF32 copies any b that is not K-major, so these take TMA there)
        cases["b strided both ways"] = (a, randn(40, 144, dtype=dtype)[:, ::2])
        cases["b's first element not 16-byte aligned"] = (a, randn(2881, dtype=dtype)[1:].view(40, 72))
    for what, (x, y) in cases.items():
        assert mm.plan(x, y).path == "pointer", what
        close64(kernels.matmul(x, y), x.double() @ y.double(), dtype=_tol(dtype, True), scale=3)
    assert mm.plan(a, b).path == "tma"
    if dtype == torch.float32:  # full fp32 (TF32 off) has no tensor cores to feed: the pointer kernel
        tf32_flag(False)
        assert mm.plan(a, b).path == "pointer"
        close64(kernels.matmul(a, b), a.double() @ b.double(), scale=3)


def test_matmul_tf32_copies_b_only_when_asked(tf32_flag, monkeypatch, close64):
    tf32_flag(True)
    copies = []
    transpose = mm.transpose
    monkeypatch.setattr(mm, "transpose", lambda x: copies.append(x.shape) or transpose(x))
    a, b = randn(37, 40), randn(40, 72)
    close64(kernels.matmul(a, b), a.double() @ b.double(), dtype=_tol(torch.float32, True), scale=3)
    assert copies == [(40, 72)]
    monkeypatch.setattr(mm, "TF32_B_K_MAJOR", False)  # no copy: the pointer kernel takes b as it is
    p = mm.plan(a, b)
    assert (p.path, p.copy_b) == ("pointer", False)
    close64(kernels.matmul(a, b), a.double() @ b.double(), dtype=_tol(torch.float32, True), scale=3)
    assert copies == [(40, 72)]


def test_matmul_decides_once_per_kind_of_call(monkeypatch):
    calls = []
    plan = mm._plan
    monkeypatch.setattr(mm, "_plan", lambda *args: calls.append(1) or plan(*args))
    monkeypatch.setattr(mm, "_plans", {})
    a, b = randn(37, 40), randn(40, 72)
    for _ in range(3):
        kernels.matmul(a, b)
    kernels.matmul(randn(37, 40), randn(40, 72))  # new tensors, same shapes and strides
    assert len(calls) == 1
    kernels.matmul(a, b[:, :64])  # another N
    assert len(calls) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_transpose_is_exact(dtype, poison_outputs):
    for x in (randn(70, 130, dtype=dtype), randn(1, 5, dtype=dtype), randn(65, 64, dtype=dtype),
              randn(40, 100, dtype=dtype)[3:33, 1:99:2], randn(90, 33, dtype=dtype).t()):
        y = mm.transpose(x)
        assert y.is_contiguous() and torch.equal(y, x.t()), tuple(x.shape)


def test_tma_tiles_fit_shared_memory():
    for (bits, size), (bm, bn, bk, stages, *_rest) in mm.TMA_CONFIGS.items():
        assert stages * (bm + bn) * bk * bits // 8 <= 227 * 1024, (bits, size)
