"""labkit.inference.decoder: the capstone GPT's weights as prefill + cached decode, against its own forward."""
import pytest
import torch

from labkit.capstone.model import GPT, GPTConfig
from labkit.inference import Decoder
from labkit.inference.graphs import DecodeStep, count_kernels

CFG = GPTConfig(vocab=97, seq=48, d_model=48, heads=6, layers=2)


@pytest.fixture(scope="module")
def gpt():
    return GPT(CFG, seed=2).double()


def test_prefill_equals_the_gpts_forward(gpt):
    idx = torch.randint(0, CFG.vocab, (3, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(Decoder(gpt).double()(idx), gpt(idx), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kv_heads", [6, 3, 2, 1])
def test_cached_decode_equals_recomputing_the_whole_prefix(gpt, kv_heads):
    dec = Decoder(gpt, kv_heads=kv_heads).double()
    idx = torch.randint(0, CFG.vocab, (2, 13), generator=torch.Generator().manual_seed(kv_heads))
    with torch.no_grad():
        cache = dec.new_cache(2, 30)
        dec(idx[:, :9], cache)
        pos = torch.full((2,), 9)
        for t in range(9, 13):  # feed the true next tokens: logits must equal a full forward's at each position
            logits = DecodeStep(dec, cache)(idx[:, t], pos)  # fixed shapes: reads all 30 positions, masked
            torch.testing.assert_close(logits, dec(idx[:, :t + 1])[:, -1], rtol=1e-10, atol=1e-12)
            pos += 1
    assert torch.equal(dec.generate(idx, 7), dec.generate(idx, 7, use_cache=False))


def test_sequences_at_different_positions_share_a_step(gpt):
    dec = Decoder(gpt, kv_heads=2).double()
    a, b = (torch.randint(0, CFG.vocab, (1, n), generator=torch.Generator().manual_seed(n)) for n in (5, 11))
    with torch.no_grad():
        cache = dec.new_cache(2, 20)
        dec(a, cache, torch.tensor([0]))
        dec(b, cache, torch.tensor([1]))
        nxt = torch.tensor([3, 4])
        got = dec.step(nxt, torch.tensor([5, 11]), cache)
        torch.testing.assert_close(got[0], dec(torch.cat([a[0], nxt[:1]])[None])[0, -1], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[1], dec(torch.cat([b[0], nxt[1:]])[None])[0, -1], rtol=1e-10, atol=1e-12)


def test_gqa_decoder_equals_mha_with_its_pooled_kv_heads_repeated(gpt):
    """GQA's k/v projections are each group's mean; an MHA model whose k/v heads repeat them is the same model."""
    gqa = Decoder(gpt, kv_heads=2).double()
    mha = Decoder(gpt).double()
    g, hd = 3, CFG.head_dim
    with torch.no_grad():
        for lg, lm in zip(gqa.layers, mha.layers):
            for name in ("k", "v"):
                src, dst = getattr(lg, name), getattr(lm, name)
                dst.weight.copy_(src.weight.view(2, 1, hd, -1).expand(2, g, hd, -1).reshape(CFG.d_model, -1))
                dst.bias.copy_(src.bias.view(2, 1, hd).expand(2, g, hd).reshape(-1))
        idx = torch.randint(0, CFG.vocab, (2, 15), generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(gqa(idx), mha(idx), rtol=1e-10, atol=1e-12)
        assert torch.equal(gqa.generate(idx, 5), mha.generate(idx, 5))


def test_bad_sizes_say_what_to_do(gpt):
    with pytest.raises(ValueError, match="must divide"):
        Decoder(gpt, kv_heads=4)
    with pytest.raises(ValueError, match="exceed"):
        Decoder(gpt).double().generate(torch.zeros(1, 40, dtype=torch.long), 20)
    with pytest.raises(ValueError, match="CUDA"):
        dec = Decoder(gpt).double()
        DecodeStep(dec, dec.new_cache(1, 8), "graph")


def test_count_kernels_counts_the_operators_a_call_makes_on_the_cpu():
    x = torch.randn(5, 7)
    assert count_kernels(lambda: torch.add(x, 1).mul(2).sum(), "cpu") == 3
    with pytest.raises(RuntimeError, match="saw no operator"):
        count_kernels(lambda: None, "cpu")


def test_a_steps_count_grows_by_the_same_number_per_layer():
    counts = []
    for layers in (1, 2, 3):
        dec = Decoder(GPT(GPTConfig(vocab=97, seq=48, d_model=48, heads=6, layers=layers), seed=2)).double()
        counts.append(DecodeStep(dec, dec.new_cache(2, 16), "eager").count(torch.tensor([3, 5]), torch.tensor([4, 9])))
    assert counts[2] - counts[1] == counts[1] - counts[0] > 0


def test_step_parts_run_every_product_and_every_layers_attention_with_their_bytes(gpt):
    from labkit.inference import Counts
    from labkit.inference.graphs import step_parts
    from labkit.inference.quant import QuantLinear

    dec = Decoder(gpt, kv_heads=2).float()
    cache = dec.new_cache(3, CFG.seq)
    parts = step_parts(dec, cache, torch.tensor([5, 9, 48]))
    assert set(parts) == {"products", "attention"}
    counts = Counts(CFG, 2, 4, 4)
    assert parts["products"][1] == counts.weight_bytes()  # every linear's weights once: what a step reads
    assert parts["attention"][1] == 3 * CFG.seq * counts.kv_bytes_per_token()
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append(m)) for m in dec.modules()
             if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        parts["products"][0]()
        parts["attention"][0]()
    for h in hooks:
        h.remove()
    assert len(seen) == 6 * CFG.layers + 1 and len(set(map(id, seen))) == len(seen)
    eight = step_parts(dec.int8(), dec.int8().new_cache(1, CFG.seq), torch.tensor([4]))
    assert eight["products"][1] == Counts(CFG, 2, 1, 4).weight_bytes()  # int8: one byte a weight
    assert any(isinstance(m, QuantLinear) for m in dec.int8().modules())
