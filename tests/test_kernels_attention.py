"""labkit.kernels.attention (FlashAttention, forward and backward) against float64 (interpreter on the CPU)."""
import sys

import pytest
import torch

import labkit
from labkit import kernels
from labkit.kernels import attention_bench

DEV = labkit.current().device
mod = sys.modules["labkit.kernels.attention"]
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}  # ‖out - ref‖ / max(‖ref‖, 1) (dq is 0 with one key)


def rel_err(out, ref):
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert not torch.isnan(out).any(), "output holds NaN (an element left unwritten?)"
    return ((out.double() - ref).norm() / max(ref.norm().item(), 1.0)).item()


def qkv(B, H, N, D, dtype, n_k=None):
    n_k = N if n_k is None else n_k
    return (torch.randn(B, H, N, D, device=DEV, dtype=dtype), torch.randn(B, H, n_k, D, device=DEV, dtype=dtype),
            torch.randn(B, H, n_k, D, device=DEV, dtype=dtype))


def check(q, k, v, causal, scale=None):
    """Forward and backward of labkit's kernel vs scaled_dot_product_attention in float64."""
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    views = leaves
    o = kernels.attention(*views, causal=causal, scale=scale)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, leaves, do)
    ref_in = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = mod.reference(*ref_in, causal=causal, scale=scale, dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, ref_in, do.double())
    assert o.dtype == q.dtype
    tol = TOL[q.dtype]
    for name, out, r in zip(("o", "dq", "dk", "dv"), (o, *grads), (ref, *ref_grads)):
        err = rel_err(out, r)
        assert err < tol, f"{name}: relative error {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_attention_matches_float64(dtype, causal, D, poison_outputs):
    torch.manual_seed(hash((str(dtype), causal, D)) % 2**31)
    check(*qkv(1, 2, 37, D, dtype), causal)  # 37 tokens: partial tiles at the edge, a two-tile diagonal


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_uneven_lengths_and_tiny(causal, poison_outputs):
    check(*qkv(2, 1, 50, 64, torch.float16, n_k=19), causal)  # more queries than keys (top-left causal mask)
    check(*qkv(1, 3, 19, 32, torch.bfloat16, n_k=50), causal)  # more keys than queries
    check(*qkv(1, 1, 1, 16, torch.float16), causal)  # one token


def test_attention_non_contiguous_and_scale(poison_outputs):
    # (batch, tokens, heads, d) transposed to (batch, heads, tokens, d): strided, last dim contiguous
    x = torch.randn(2, 33, 3, 3, 64, device=DEV, dtype=torch.bfloat16)
    q, k, v = (x[:, :, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    check(q, k, v, causal=True)
    # last dim not contiguous: copied first; a custom scale
    qt = torch.randn(1, 2, 64, 29, device=DEV, dtype=torch.float16).transpose(-1, -2)
    check(qt, *qkv(1, 2, 29, 64, torch.float16)[1:], causal=False, scale=0.3)


def test_attention_late_maximum_rescales():
    # The largest score arrives in the last key tile: earlier sums must be rescaled, not overflow.
    q, k, v = qkv(1, 1, 40, 64, torch.float16)
    k[..., 39, :] = q[..., 5, :] * 4
    ref = mod.reference(q.double(), k.double(), v.double(), dtype=torch.float64)
    assert rel_err(kernels.attention(q, k, v), ref) < TOL[torch.float16]


def test_attention_lse_is_log2_sum_exp2():
    q, k, v = qkv(1, 2, 21, 32, torch.float16)
    _, lse = mod.attention_forward(q, k, v, causal=False, scale=32 ** -0.5)
    s = (q.double() @ k.double().transpose(-1, -2)) * 32 ** -0.5
    torch.testing.assert_close(lse.double().view(1, 2, 21), torch.logsumexp(s, -1) * mod.LOG2E, rtol=1e-3, atol=1e-3)


def test_attention_bad_inputs():
    q, k, v = qkv(1, 1, 8, 64, torch.float16)
    with pytest.raises(TypeError, match=r"float32.*float16, bfloat16. Convert it, e.g. q.to\(torch.float16\)"):
        kernels.attention(q.float(), k.float(), v.float())
    with pytest.raises(TypeError, match="share one dtype"):
        kernels.attention(q, k.bfloat16(), v)
    with pytest.raises(ValueError, match="head dim 48 is not supported.*pad"):
        kernels.attention(*qkv(1, 1, 8, 48, torch.float16))
    with pytest.raises(ValueError, match="4-D"):
        kernels.attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="k and v must have shape"):
        kernels.attention(q, k, v[:, :, :4])
    with pytest.raises(ValueError, match="at least one"):
        kernels.attention(q[:, :, :0], k, v)
    with pytest.raises(ValueError, match="meta"):
        kernels.attention(*(torch.empty(1, 1, 8, 64, device="meta", dtype=torch.float16) for _ in range(3)))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        kernels.attention(q.tolist(), k, v)


def test_attention_counts():
    assert kernels.attention.flops(1, 1, 1024, 64) == 4 * 1024 * 1024 * 64
    assert kernels.attention.flops(2, 3, 1024, 64, causal=True) == 2 * 3 * 2 * 1024 * 1024 * 64
    assert kernels.attention.flops(1, 1, 16, 64, backward=True) == 2.5 * 4 * 16 * 16 * 64
    assert kernels.attention.min_bytes(1, 2, 100, 64, torch.bfloat16) == 4 * 2 * 100 * 64 * 2 + 4 * 2 * 100
    assert mod.naive_bytes(1, 1, 100, 64, torch.bfloat16) == 28 * 100 * 100 + 8 * 100 * 64
    assert mod.naive_bytes(1, 1, 100, 64, torch.float32) == 24 * 100 * 100 + 16 * 100 * 64


def test_attention_bench_case_runs():
    case = attention_bench.bench_case("1x1x24x16", torch.float16, causal=True, use_compile=False)
    case["fn"]()
    assert case["baselines"]["naive"] is not None and case["baselines"]["math"] is not None
    bwd = attention_bench.bench_case("1x1x24x16", torch.float16, backward=True, use_compile=False)
    assert len(bwd["fn"]()) == 3 and bwd["flops"] == mod.flops(1, 1, 24, 16, backward=True)


def test_labkit_bench_attention_expands_to_four_cases():
    from labkit.tools import bench as benchmark

    assert benchmark.kernel_groups()["attention"] == ["attention_fwd", "attention_causal_fwd", "attention_bwd",
                                                      "attention_causal_bwd"]
    bench = benchmark.bench_cases()["attention_causal_bwd"]
    case = bench.make((1, 1, 24, 16), torch.float16, False)
    assert case.shape == "1x1x24x16 causal" and case.work == mod.flops(1, 1, 24, 16, causal=True, backward=True)
    assert set(case.baselines) == set(bench.baselines)
    case.triton()


def test_attention_bench_compile_baseline_backward_runs_again():
    # The bench times a backward again and again on one kept graph (retain_graph); compile's backward with donated
    # buffers refuses that (it failed in `labkit bench attention` on an H200, 2026-11-28). The case lets it.
    import torch._functorch.config as functorch_config
    # the setting is restored after (torch's own patch: pytest's monkeypatch deletes a config entry it restores)
    with functorch_config.patch(donated_buffer=functorch_config.donated_buffer):
        bwd = attention_bench.bench_case("1x1x24x16", torch.bfloat16, backward=True, use_compile=True)
        compiled = bwd["baselines"]["compile"]
        assert compiled is not None
        for _ in range(2):
            assert len(compiled()) == 3
