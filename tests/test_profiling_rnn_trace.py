"""labkit.profiling.rnn_trace: the Python-loop LSTM cell computes what nn.LSTM (same weights) computes."""
import torch

from labkit.profiling.rnn_trace import make_rnn, rnn_loop


def test_cell_loop_matches_the_fused_lstm():
    torch.manual_seed(1)
    cell, lstm, x, h, c = make_rnn(hidden=13, batch=3, seq=7, device="cpu", features=5, seed=4)
    assert x.shape == (7, 3, 5) and h.shape == (3, 13) and not h.abs().sum()
    cell64, lstm64 = cell.double(), lstm.double()
    with torch.no_grad():
        looped = rnn_loop(cell64, x.double(), h.double(), c.double())
        out, (h_n, _) = lstm64(x.double(), (h.double()[None], c.double()[None]))
    torch.testing.assert_close(looped, h_n[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(looped, out[-1], rtol=1e-12, atol=1e-12)
    assert looped.abs().max() > 1e-3   # not all zeros: the weights and input are random


def test_same_seed_same_weights_other_seed_others():
    a, _, xa, _, _ = make_rnn(8, 2, 3, "cpu", seed=0)
    b, _, xb, _, _ = make_rnn(8, 2, 3, "cpu", seed=0)
    c, _, _, _, _ = make_rnn(8, 2, 3, "cpu", seed=1)
    assert torch.equal(a.weight_ih, b.weight_ih) and torch.equal(xa, xb)
    assert not torch.equal(a.weight_ih, c.weight_ih)
