"""labkit.kernels.softmax (one-pass and online) against a float64 reference (interpreter on the CPU)."""
import pytest
import torch

import labkit
from labkit import kernels

DEV = labkit.current().device


def randn(*shape, dtype=torch.float32, scale=3.0):
    return (scale * torch.randn(*shape, device=DEV)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("online", [False, True], ids=["one-pass", "online"])
def test_softmax_matches_float64(dtype, online, poison_outputs, close64):
    for shape in [(3, 37), (2, 3, 129), (1,), (17, 1)]:
        x = randn(*shape, dtype=dtype)
        y = kernels.softmax(x, online=online)
        assert y.dtype == dtype and y.shape == x.shape
        close64(y, torch.softmax(x.double(), dim=-1))


def test_online_softmax_spans_several_chunks(poison_outputs, close64, monkeypatch):
    mod = kernels.modules()["softmax"]
    monkeypatch.setattr(mod, "ONLINE_BLOCK", 64)  # rows of 333 take six chunks, the last one partial
    x = randn(5, 333)
    x[1, 300] = 40.0  # the row maximum arrives late: earlier sums must be rescaled
    close64(kernels.softmax(x, online=True), torch.softmax(x.double(), dim=-1))
    # The automatic choice streams rows longer than the one-pass limit.
    monkeypatch.setitem(mod.MAX_FUSED_COLS, torch.float32, 128)
    close64(kernels.softmax(x), torch.softmax(x.double(), dim=-1))


def test_softmax_non_contiguous_and_extreme_values(poison_outputs, close64):
    x = randn(9, 200)[:, 5:134]  # strided rows
    close64(kernels.softmax(x), torch.softmax(x.double(), dim=-1))
    xt = randn(37, 6).t()  # last dim not contiguous: copied first
    close64(kernels.softmax(xt), torch.softmax(xt.double(), dim=-1))
    big = torch.tensor([[1000.0, 999.0, -1000.0], [-float("inf"), 0.0, 1.0]], device=DEV)
    close64(kernels.softmax(big), torch.softmax(big.double(), dim=-1))
    close64(kernels.softmax(big, online=True), torch.softmax(big.double(), dim=-1))


def test_softmax_bad_inputs():
    with pytest.raises(TypeError, match="int64.*accepted: float32, float16, bfloat16"):
        kernels.softmax(torch.ones(3, 4, dtype=torch.int64, device=DEV))
    with pytest.raises(ValueError, match="0-d"):
        kernels.softmax(torch.tensor(1.0, device=DEV))
    with pytest.raises(ValueError, match="meta"):
        kernels.softmax(torch.empty(3, 4, device="meta"))


def test_softmax_counts():
    assert kernels.softmax.min_bytes((16, 1024), torch.float32) == 2 * 16 * 1024 * 4
    assert kernels.softmax.min_bytes((16, 1024), torch.bfloat16) == 2 * 16 * 1024 * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_split_rows_match_float64(dtype, poison_outputs, close64, monkeypatch):
    # Every dtype through the split path (forced: by default only long rows, or few rows, are split).
    mod = kernels.modules()["softmax"]
    monkeypatch.setattr(mod, "SPLIT_CHUNK", 64)  # rows of 333 take six chunks, the last one partial
    x = randn(5, 333, dtype=dtype)
    x[1, 300] = 40.0  # the row maximum sits in the last chunk
    x[3, :200] = -float("inf")  # whole chunks of -inf (masked attention): their sums must count as 0
    x[4] *= 30  # chunk maxima far apart: each chunk's exp(x - chunk max) is rescaled by exp(chunk max - row max)
    close64(kernels.softmax(x, split=True), torch.softmax(x.double(), dim=-1))
    xs = randn(3, 400, dtype=dtype)[:, 7:300]  # strided rows of 293
    close64(kernels.softmax(xs, split=True), torch.softmax(xs.double(), dim=-1))
    one = randn(2, 40, dtype=dtype)  # a single chunk per row
    close64(kernels.softmax(one, split=True), torch.softmax(one.double(), dim=-1))


def test_split_is_chosen_for_long_or_few_rows():
    from labkit.kernels.softmax import MAX_FUSED_COLS, use_split
    cpu = torch.device("cpu")
    assert use_split(1024, MAX_FUSED_COLS[torch.float32] + 1, torch.float32, cpu)
    assert not use_split(65536, 1024, torch.bfloat16, cpu)
    assert use_split(2, 16384, torch.float32, cpu)  # two rows: chunks give the SMs work
    assert not use_split(2, 1024, torch.float32, cpu)
    assert use_split(1024, 65536, torch.bfloat16, cpu)  # 16-bit long rows split too (one exp per element)
    assert not use_split(1024, MAX_FUSED_COLS[torch.bfloat16], torch.bfloat16, cpu)
