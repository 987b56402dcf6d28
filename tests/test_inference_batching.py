"""labkit.inference.batching: both schedules serve every request its tokens, the ones it would get alone."""
import pytest
import torch

from labkit.capstone.model import GPT, GPTConfig
from labkit.inference import Decoder
from labkit.inference.batching import Request, count_steps, run
from labkit.inference.counts import Counts, paged_kv_tokens
from labkit.inference.graphs import DecodeStep

CFG = GPTConfig(vocab=89, seq=64, d_model=32, heads=4, layers=2)


@pytest.fixture(scope="module")
def setup():
    dec = Decoder(GPT(CFG, seed=7), kv_heads=2).double()
    g = torch.Generator().manual_seed(3)
    reqs = [Request(i, torch.randint(0, CFG.vocab, (int(torch.randint(1, 20, (), generator=g)),), generator=g),
                    int(torch.randint(1, 25, (), generator=g))) for i in range(9)]
    alone = {r.rid: dec.generate(r.prompt.view(1, -1), r.max_new)[0].tolist() for r in reqs}
    return dec, reqs, alone


@pytest.mark.parametrize("policy", ["static", "continuous"])
@pytest.mark.parametrize("slots", [1, 3, 4])
def test_every_request_gets_its_own_tokens_in_the_counted_steps(setup, policy, slots):
    dec, reqs, alone = setup
    cache = dec.new_cache(slots, 48)
    out = run(dec, cache, DecodeStep(dec, cache), reqs, policy)
    assert out.tokens == alone  # exactly max_new tokens each, the same as decoding it alone
    assert out.steps == count_steps([r.max_new for r in reqs], slots, policy)
    assert out.max_active <= slots and set(out.finish_s) == {r.rid for r in reqs}
    assert all(out.first_s[r] <= out.finish_s[r] for r in out.finish_s)


def test_continuous_never_needs_more_steps_and_counts_are_exact_on_small_cases():
    assert count_steps([5, 1, 1, 1], 2, "static") == 4 + 0
    assert count_steps([5, 1, 1, 1], 2, "continuous") == 4
    assert count_steps([3, 3, 3], 1, "static") == count_steps([3, 3, 3], 1, "continuous") == 6
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        news = torch.randint(1, 40, (int(torch.randint(1, 30, (), generator=g)),), generator=g).tolist()
        s = int(torch.randint(1, 8, (), generator=g))
        assert count_steps(news, s, "continuous") <= count_steps(news, s, "static")
        assert count_steps(news, s, "continuous") >= (sum(news) - len(news)) / s


def test_requests_that_do_not_fit_are_refused():
    dec = Decoder(GPT(CFG, seed=7)).double()
    cache = dec.new_cache(2, 10)
    with pytest.raises(ValueError, match="do not fit"):
        run(dec, cache, DecodeStep(dec, cache), [Request(0, torch.zeros(8, dtype=torch.long), 5)], "static")
    with pytest.raises(ValueError, match="policy"):
        run(dec, cache, DecodeStep(dec, cache), [], "fifo")


def test_counts_match_the_decoders_weights_and_cache():
    dec = Decoder(GPT(CFG, seed=1), kv_heads=2)
    c = Counts(CFG, 2, 4, 4)
    linear = sum(m.weight.numel() for m in dec.modules() if isinstance(m, torch.nn.Linear))
    assert c.linear_params() == linear and c.weight_bytes() == 4 * linear
    assert c.kv_bytes_per_token() * 3 * 20 == dec.new_cache(3, 20).nbytes()
    assert c.decode_bytes(3, 20) == 4 * linear + 3 * 20 * c.kv_bytes_per_token()
    assert paged_kv_tokens([1, 16, 17], 32, 16) == (34, 96, 64)
