"""labkit.precision: matmul in each precision against fp64, format facts, and clear errors."""
import math

import pytest
import torch

from labkit import precision

CPU_OK = [p for p in precision.PRECISIONS if precision.supported(p, "cpu")[0]]


def test_fp32_and_bf16_are_supported_on_cpu_and_tf32_is_explained():
    assert precision.supported("fp32", "cpu") == (True, "")
    assert precision.supported("bf16", "cpu") == (True, "")
    ok, why = precision.supported("tf32", "cpu")
    assert not ok and "tensor cores" in why


def test_unknown_precision_says_what_to_pick():
    with pytest.raises(ValueError, match="pick one of those"):
        precision.relative_error(8, "fp8")
    with pytest.raises(ValueError, match="pick one of those"):
        precision.supported("float32", "cpu")


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="positive int"):
        precision.inputs(bad, "cpu")


@pytest.mark.parametrize("p", CPU_OK)
@pytest.mark.parametrize("shape", [(37, 53, 29), (3, 17, 2)])
def test_matmul_in_matches_fp64_on_odd_non_contiguous_inputs(p, shape):
    m, k, n = shape
    g = torch.Generator().manual_seed(m * 1000 + k)
    a = torch.randn(k, m, generator=g, dtype=torch.float64).T          # non-contiguous view
    b = torch.randn(n, k, generator=g, dtype=torch.float64).T
    assert not a.is_contiguous() and not b.is_contiguous()
    out = precision.matmul_in(a, b, p)
    assert out.dtype == precision.PRECISIONS[p] and out.shape == (m, n)
    assert torch.isfinite(out).all()
    ref = a @ b
    # each product term is rounded: error per entry <= ~k * u * sum|a||b| (k-term dot product bound)
    bound = 2 * k * precision.unit_roundoff(p) * (a.abs() @ b.abs())
    assert ((out.double() - ref).abs() <= bound + 1e-30).all()


def test_matmul_in_refuses_mixed_devices():
    a = torch.randn(4, 4, dtype=torch.float64)
    b = torch.randn(4, 4, dtype=torch.float64, device="meta")
    with pytest.raises(ValueError, match="move both"):
        precision.matmul_in(a, b, "fp32")


@pytest.mark.parametrize("n", [33, 65])
def test_relative_error_tracks_each_formats_roundoff(n):
    errs = precision.relative_errors(n, CPU_OK, "cpu", seed=n)
    for p, e in errs.items():
        u = precision.unit_roundoff(p)
        assert u / 50 < e < 4 * u, (p, e, u)
    assert errs["fp32"] < errs["bf16"]
    if "fp16" in errs:
        assert errs["fp32"] < errs["fp16"] < errs["bf16"]
    assert precision.relative_error(n, "bf16", "cpu", seed=n) == errs["bf16"]


def test_inputs_are_fresh_random_and_reproducible():
    a, b = precision.inputs(9, "cpu", seed=4)
    a2, _ = precision.inputs(9, "cpu", seed=4)
    a3, _ = precision.inputs(9, "cpu", seed=5)
    assert a.dtype == torch.float64 and (a != 0).all() and (b != 0).all()
    assert torch.equal(a, a2) and not torch.equal(a, a3) and not torch.equal(a, b)


def test_tf32_context_restores_the_setting_even_on_error():
    old = torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(KeyError):
        with precision.tf32(not old):
            assert torch.backends.cuda.matmul.allow_tf32 == (not old)
            raise KeyError("boom")
    assert torch.backends.cuda.matmul.allow_tf32 == old


def test_matmul_rate_returns_a_measured_rate_for_odd_shapes():
    r = precision.matmul_rate(13, "fp32", device="cpu", rep_ms=1, shape=(13, 7, 11))
    assert r.precision == "fp32" and r.timing.n >= 5
    assert math.isfinite(r.tflops) and r.tflops > 0
    assert r.tflops == pytest.approx(2 * 13 * 7 * 11 / r.timing.median_ms / 1e9)
    with pytest.raises(ValueError):
        precision.matmul_rate(8, "fp32", device="cpu", shape=(8, 0, 8))


@pytest.mark.parametrize("p", ["fp32", "fp16", "bf16"])
def test_format_rows_and_unit_roundoff_agree_with_finfo(p):
    row = {r["format"]: r for r in precision.format_rows()}[p]
    fi = torch.finfo(precision.PRECISIONS[p])
    assert row["max"] == fi.max and row["smallest normal"] == fi.smallest_normal and row["eps"] == fi.eps
    assert precision.unit_roundoff(p) == fi.eps / 2
    # the smallest subnormal is representable and half of it rounds to zero
    tiny = torch.tensor(row["smallest subnormal"], dtype=torch.float64)
    assert tiny.to(precision.PRECISIONS[p]).item() == row["smallest subnormal"]
    assert (tiny / 4).to(precision.PRECISIONS[p]).item() == 0.0


def test_tf32_row_has_fp32_range_and_fp16_precision():
    rows = {r["format"]: r for r in precision.format_rows()}
    assert rows["tf32"]["max"] == rows["fp32"]["max"]
    assert rows["tf32"]["eps"] == rows["fp16"]["eps"] == 2.0**-10


def test_zero_fraction_counts_only_new_zeros():
    ref = torch.tensor([1.0, 0.0, 3.0, 4.0])
    assert precision.zero_fraction(torch.tensor([0.0, 0.0, 3.0, 0.0]), ref) == 0.5
    assert precision.zero_fraction(ref.clone(), ref) == 0.0
    # an fp16 cast really flushes tiny values
    tiny = torch.tensor([1e-9, 1e-3, 2e-8, 1.0], dtype=torch.float64)
    assert precision.zero_fraction(tiny.half().double(), tiny) == 0.5
    with pytest.raises(ValueError, match="shapes differ"):
        precision.zero_fraction(torch.zeros(3), ref)


@pytest.mark.parametrize("n", [40, 96])
def test_error_model_predicts_measured_errors(n):
    errs = precision.relative_errors(n, CPU_OK, "cpu", seed=n + 1)
    for p, e in errs.items():
        model = precision.error_model(n, p)
        assert model / 1.5 < e < 1.5 * model, (p, e, model)


def test_error_model_grows_like_sqrt_k_for_fp32_only():
    assert precision.error_model(4 * 4096, "fp32") / precision.error_model(4096, "fp32") == pytest.approx(2, rel=0.01)
    assert precision.error_model(8192, "bf16") == pytest.approx(precision.error_model(64, "bf16"), rel=0.01)
    assert precision.worst_case_bound(1000) == 1000 * precision.unit_roundoff("fp32")
    with pytest.raises(ValueError, match="positive int"):
        precision.error_model(0, "fp32")


def test_fp8_rounding_is_scaled_and_its_error_follows_the_model():
    x = torch.randn(37, 53, dtype=torch.float64) * 1e3
    x8, scale = precision.to_fp8(x)
    assert x8.dtype == torch.float8_e4m3fn
    assert x8.double().abs().max().item() == precision.FP8_MAX          # the largest value maps to 448
    assert float(((x8.double() * scale) - x).abs().max() / x.abs().max()) <= 2**-4
    a, b = precision.inputs(64, "cpu", seed=2)
    c = precision.fp8_matmul(a, b.T.contiguous().T, emulate=True)
    assert c.dtype == torch.bfloat16 and c.shape == (64, 64)
    ref = a @ b
    err = float((c.double() - ref).norm() / ref.norm())
    assert precision.error_model(64, "fp8") / 1.5 < err < 1.5 * precision.error_model(64, "fp8")


def test_fp8_on_a_cpu_says_why_and_what_to_do():
    ok, why = precision.fp8_supported("cpu")
    assert not ok and "FP8 tensor cores" in why
    with pytest.raises(RuntimeError, match="emulate=True"):
        precision.fp8_matmul(torch.randn(16, 16), torch.randn(16, 16))
    with pytest.raises(RuntimeError):
        precision.fp8_rate(16, device="cpu")


def test_format_rows_include_fp8():
    rows = {r["format"]: r for r in precision.format_rows()}
    assert rows["fp8 e4m3"]["max"] == 448 and rows["fp8 e4m3"]["mantissa bits"] == 3
    assert rows["fp8 e5m2"]["exponent bits"] == 5 and rows["fp8 e5m2"]["eps"] == 0.25


def test_each_summation_order_rounds_as_counted():
    """One chain, k-blocks and a pairwise tree, summed in float32 here: each error is the model's for its order."""
    import numpy as np

    rows, k, b = 300, 4096, 64
    x = np.random.default_rng(7).standard_normal((rows, k)).astype(np.float32)
    exact = x.astype(np.float64).sum(axis=1)
    chain = np.add.accumulate(x, axis=1, dtype=np.float32)[:, -1]
    blocks = np.add.accumulate(x.reshape(rows, k // b, b), axis=2, dtype=np.float32)[:, :, -1]
    blocked = np.add.accumulate(blocks, axis=1, dtype=np.float32)[:, -1]
    tree = x
    while tree.shape[1] > 1:
        tree = (tree[:, ::2] + tree[:, 1::2]).astype(np.float32)
    u, rms = precision.unit_roundoff("fp32"), precision.ROUNDING_RMS
    for got, roundings in ((chain, k / 2), (blocked, (b + k / b) / 2), (tree[:, 0], math.log2(k))):
        measured = math.sqrt(np.mean((got - exact) ** 2) / np.mean(exact**2))
        assert rms * u * math.sqrt(roundings) / 1.3 < measured < 1.3 * rms * u * math.sqrt(roundings), roundings
    models = [precision.error_model(k, "fp32", s) for s in ("tree", math.isqrt(k), b // 4, "chain")]
    assert models == sorted(models) and precision.error_model(k, "fp32", k) == models[-1]
    with pytest.raises(ValueError, match="'chain', 'tree' or a k-block size"):
        precision.error_model(k, "fp32", "blocked")
