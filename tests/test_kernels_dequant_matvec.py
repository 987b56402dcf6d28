"""labkit.kernels.dequant_matvec (one-byte weights times a few rows) against a float64 reference; QuantLinear's
choice of path (Triton interpreter on the CPU, the compiled kernel on a GPU)."""
import importlib

import pytest
import torch

import labkit
from labkit.inference.quant import FP8, QuantLinear, quantize_rows

dq = importlib.import_module("labkit.kernels.dequant_matvec")
DEV = labkit.current().device
XDTYPES = [torch.float32, torch.float16, torch.bfloat16]


def weights(N: int, K: int, wdtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed))
    q, s = quantize_rows(w, wdtype)
    return q.to(DEV), s.to(DEV)


@pytest.mark.parametrize("wdtype", [torch.int8, FP8])
@pytest.mark.parametrize("xdtype", XDTYPES)
def test_matches_float64_on_odd_sizes_and_every_row_count(wdtype, xdtype, poison_outputs, close64):
    for seed, (M, N, K) in enumerate([(1, 37, 100), (3, 5, 4097), (8, 129, 64), (5, 1, 3)]):
        q, s = weights(N, K, wdtype, seed)
        x = torch.randn(M, K, device=DEV).to(xdtype)
        b = torch.randn(N, device=DEV).to(xdtype)
        for bias in (b, None):
            y = dq.dequant_matvec(x, q, s.to(xdtype), bias)
            assert y.dtype == xdtype and y.shape == (M, N)
            close64(y, dq.reference(x, q, s.to(xdtype), bias).double(), scale=4)


def test_takes_batched_and_strided_inputs(poison_outputs, close64):
    q, s = weights(33, 70, torch.int8, 7)
    x = torch.randn(2, 1, 140, device=DEV)[..., ::2]  # (2, 1, 70), every other element
    qt = torch.randn(70, 33, device=DEV).t()  # (33, 70) transposed: made contiguous
    q_strided = qt.clamp(-1, 1).mul(100).round().to(torch.int8)
    b = torch.randn(66, device=DEV)[::2]
    for qq in (q, q_strided):
        y = dq.dequant_matvec(x, qq, s, b)
        assert y.shape == (2, 1, 33)
        close64(y, dq.reference(x, qq, s, b))


def test_bad_inputs_get_errors_that_say_what_to_do():
    q, s = weights(8, 16, torch.int8, 1)
    x = torch.randn(1, 16, device=DEV)
    with pytest.raises(ValueError, match="more than 8.*convert the weights"):
        dq.dequant_matvec(torch.randn(9, 16, device=DEV), q, s)
    with pytest.raises(ValueError, match=r"q must be \(N, K\) with K = x.shape\[-1\]"):
        dq.dequant_matvec(torch.randn(1, 15, device=DEV), q, s)
    with pytest.raises(ValueError, match=r"scale must have shape \(8,\)"):
        dq.dequant_matvec(x, q, s[:7])
    with pytest.raises(TypeError, match="q has dtype float32; accepted: int8, float8_e4m3fn"):
        dq.dequant_matvec(x, q.float(), s)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        dq.dequant_matvec(x, q, s, torch.zeros(3, device=DEV))


def test_no_inputs_and_no_rows_give_the_bias():
    q, s = torch.zeros(4, 0, dtype=torch.int8, device=DEV), torch.ones(4, device=DEV)
    b = torch.arange(4.0, device=DEV)
    torch.testing.assert_close(dq.dequant_matvec(torch.zeros(2, 0, device=DEV), q, s, b), b.expand(2, 4))
    assert dq.dequant_matvec(torch.zeros(0, 5, device=DEV), torch.zeros(3, 5, dtype=torch.int8, device=DEV),
                             torch.ones(3, device=DEV)).shape == (0, 3)


def test_quant_linear_takes_the_kernel_on_a_gpu_and_the_matmul_elsewhere(monkeypatch):
    lin = torch.nn.Linear(48, 24).to(DEV)
    m = QuantLinear(lin, torch.float32)
    x = torch.randn(2, 1, 48, device=DEV)
    calls = []
    real = dq.dequant_matvec
    quant = importlib.import_module("labkit.inference.quant")
    if quant._gpu_matvec:
        monkeypatch.setattr(quant, "_gpu_matvec", lambda *a: calls.append(1) or real(*a))
    ref = x.double() @ (m.q.double() * m.scale.double()[:, None]).T + m.bias.double()
    torch.testing.assert_close(m(x).double(), ref, rtol=1e-5, atol=1e-5)
    assert calls == ([1] if DEV.type == "cuda" else [])
    many = torch.randn(9, 48, device=DEV)  # more rows than the kernel takes: the matmul
    torch.testing.assert_close(m(many).double(), many.double() @ (m.q.double() * m.scale.double()[:, None]).T
                               + m.bias.double(), rtol=1e-5, atol=1e-5)
    assert len(calls) == (1 if DEV.type == "cuda" else 0)
    xg = x.clone().requires_grad_()  # the kernel has no backward: a graph to record takes the matmul
    m(xg).sum().backward()
    torch.testing.assert_close(xg.grad.double(), (m.q.double() * m.scale.double()[:, None]).sum(0).expand(2, 1, 48),
                               rtol=1e-5, atol=1e-5)
    assert len(calls) == (1 if DEV.type == "cuda" else 0)


@pytest.mark.skipif(DEV.type != "cuda", reason="the custom op runs the compiled kernel: a CUDA GPU")
def test_a_compiled_quant_linear_has_no_graph_break():
    m = QuantLinear(torch.nn.Linear(256, 320).to(DEV), torch.bfloat16)
    x = torch.randn(1, 1, 256, device=DEV, dtype=torch.bfloat16)
    got = torch.compile(m, fullgraph=True)(x)
    torch.testing.assert_close(got, dq.dequant_matvec(x, m.q, m.scale, m.bias))
