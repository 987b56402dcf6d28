"""labkit.inference.kvcache: the cache write and one query's attention, against float64 loops."""
import math

import pytest
import torch

from labkit.inference.kvcache import KVCache, decode_attention, update_cache


def loop_attention(q, ck, cv, lengths):
    B, H, D = q.shape
    g = H // ck.shape[1]
    out = torch.empty(B, H, D, dtype=torch.float64)
    for b in range(B):
        n = int(lengths[b])
        for h in range(H):
            p = torch.softmax(ck[b, h // g, :n].double() @ q[b, h].double() / math.sqrt(D), 0)
            out[b, h] = p @ cv[b, h // g, :n].double()
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("B,H,kvh,L,D", [(1, 4, 4, 7, 8), (3, 6, 2, 29, 16), (5, 8, 1, 33, 32)])
def test_decode_attention_matches_float64_and_reads_only_each_prefix(B, H, kvh, L, D, dtype, tol):
    g = torch.Generator().manual_seed(B * 100 + L)
    q = torch.randn(B, H, D, generator=g).to(dtype)
    ck, cv = (torch.randn(B, kvh, L, D, generator=g).to(dtype) for _ in range(2))
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    ref = loop_attention(q, ck, cv, lengths)
    torch.testing.assert_close(decode_attention(q, ck, cv, lengths).double(), ref, rtol=tol, atol=tol)
    ck2, cv2 = ck.clone(), cv.clone()  # stale values past each length change nothing
    for b in range(B):
        ck2[b, :, int(lengths[b]):] = 1e4
        cv2[b, :, int(lengths[b]):] = -1e4
    torch.testing.assert_close(decode_attention(q, ck2, cv2, lengths), decode_attention(q, ck, cv, lengths))


def test_gqa_equals_mha_with_each_kv_head_repeated():
    g = torch.Generator().manual_seed(3)
    B, H, kvh, L, D = 3, 8, 2, 19, 16
    q = torch.randn(B, H, D, generator=g, dtype=torch.float64)
    ck, cv = (torch.randn(B, kvh, L, D, generator=g, dtype=torch.float64) for _ in range(2))
    lengths = torch.tensor([19, 4, 11])
    rep = [t.repeat_interleave(H // kvh, dim=1) for t in (ck, cv)]
    torch.testing.assert_close(decode_attention(q, ck, cv, lengths), decode_attention(q, *rep, lengths))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_update_cache_writes_each_rows_tokens_at_its_own_positions_only(dtype):
    g = torch.Generator().manual_seed(5)
    B, H, L, D, T = 4, 3, 23, 8, 5
    ck, cv = (torch.randn(B, H, L, D, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, T, H, D, generator=g).to(dtype).transpose(1, 2) for _ in range(2))  # non-contiguous
    pos = torch.tensor([0, 18, 7, 3])
    ek, ev = ck.clone(), cv.clone()
    for b in range(B):
        ek[b, :, pos[b]:pos[b] + T], ev[b, :, pos[b]:pos[b] + T] = k[b], v[b]
    out = update_cache(ck, cv, k, v, pos)
    assert out[0] is ck and torch.equal(ck, ek) and torch.equal(cv, ev)


def test_update_cache_refuses_positions_of_the_wrong_shape():
    ck = torch.zeros(2, 1, 4, 2)
    with pytest.raises(ValueError, match="one start position per sequence"):
        update_cache(ck, ck.clone(), torch.zeros(2, 1, 1, 2), torch.zeros(2, 1, 1, 2), torch.tensor([0]))


def test_cache_bytes_are_2_x_layers_x_kv_heads_x_head_dim_x_bytes_per_token():
    c = KVCache.empty(3, 2, 4, 10, 8, torch.bfloat16, "cpu")
    assert c.nbytes() == 2 * 3 * 4 * 8 * 2 * (2 * 10) and c.max_len == 10
