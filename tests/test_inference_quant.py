"""labkit.inference.quant: int8 weights within half a scale of the originals; the int8 model's error stays bounded."""
import pytest
import torch

from labkit.capstone.model import GPT, GPTConfig
from labkit.inference import Decoder
from labkit.inference.quant import QuantLinear, quantize_rows, weight_error


def test_rows_round_to_within_half_a_scale_and_the_row_max_is_exact():
    w = torch.randn(37, 53, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q, s = quantize_rows(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    err = (q.double() * s.double()[:, None] - w).abs()
    assert (err <= s.double()[:, None] / 2 + 1e-7).all()
    assert (q.abs().amax(1) == 127).all()


def test_int8_linear_equals_its_dequantized_float64_matmul():
    lin = torch.nn.Linear(29, 41).double()
    x = torch.randn(3, 5, 29, dtype=torch.float64)
    m = QuantLinear(lin, torch.float64)
    ref = x @ (m.q.double() * m.scale[:, None]).T + lin.bias
    torch.testing.assert_close(m(x), ref.detach(), rtol=1e-12, atol=1e-12)


def test_int8_decoder_logit_error_is_bounded_by_twice_the_weights_error():
    cfg = GPTConfig(vocab=211, seq=64, d_model=64, heads=4, layers=3)
    dec = Decoder(GPT(cfg, seed=4), kv_heads=2).double()
    dec8 = dec.int8()
    idx = torch.randint(0, cfg.vocab, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, got = dec(idx), dec8(idx)
    rel = float((got - ref).norm() / ref.norm())
    w = weight_error(dec, dec8)
    assert 0 < rel < 2 * w and 1e-3 < w < 2e-2, (rel, w)
    assert all(isinstance(m, QuantLinear) for m in (dec8.head, dec8.layers[0].q, dec8.layers[1].fc))


def test_fp8_rows_keep_three_mantissa_bits_and_map_the_row_max_to_448():
    from labkit.inference.quant import FP8

    w = torch.randn(37, 53, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    q, s = quantize_rows(w, FP8)
    assert q.dtype == FP8
    back = q.double() * s.double()[:, None]
    assert ((back - w).abs() <= w.abs() / 16 + 1e-6 * s.double()[:, None]).all()  # within 1/16 of each weight
    assert (q.double().abs().amax(1) == 448).all()
    with pytest.raises(ValueError, match="int8 or torch.float8_e4m3fn"):
        quantize_rows(w, torch.float16)


def test_fp8_weights_err_more_than_int8_at_the_same_bytes_and_the_fp8_model_stays_bounded():
    cfg = GPTConfig(vocab=211, seq=64, d_model=64, heads=4, layers=3)
    dec = Decoder(GPT(cfg, seed=4), kv_heads=2).double()
    dec8, decf = dec.int8(), dec.fp8()
    assert all(m.q.dtype == torch.float8_e4m3fn for m in decf.modules() if isinstance(m, QuantLinear))
    idx = torch.randint(0, cfg.vocab, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, got = dec(idx), decf(idx)
    w8, wf = weight_error(dec, dec8), weight_error(dec, decf)
    assert wf > 1.5 * w8, (wf, w8)  # 3 mantissa bits per weight vs 254 steps over each row's range
    assert 0 < float((got - ref).norm() / ref.norm()) < 2 * wf
