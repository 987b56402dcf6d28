"""The KV cache: one (batch, kv_heads, max_len, head_dim) buffer per layer for keys and one for values, the
write of new keys/values at each sequence's own position, and one query's attention against the cache.

Used by: notebook 14, exercise 14.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """Keys and values, one (batch, kv_heads, max_len, head_dim) tensor per layer: k[l], v[l]. Separate tensors, not
    views of one, so that torch.compile writes a step's new keys where they lie instead of copying the layer."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def empty(cls, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
              dtype: torch.dtype, device: torch.device | str) -> KVCache:
        shape = (batch, kv_heads, max_len, head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)])

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def device(self) -> torch.device:
        return self.k[0].device

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))


def update_cache(cache_k: torch.Tensor, cache_v: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Write k, v (B, kv_heads, T, hd) into the caches (B, kv_heads, max_len, hd) at positions pos[b] .. pos[b]+T-1
    of each sequence b, in place (an index_put: no host sync, so a CUDA graph can replay it, and torch.compile
    updates the cache where it lies instead of copying it); returns the caches."""
    B, H, T, D = k.shape
    if pos.shape != (B,):
        raise ValueError(f"update_cache: pos must hold one start position per sequence, shape ({B},), got "
                         f"{tuple(pos.shape)}")
    rows = torch.arange(B, device=pos.device).view(B, 1)
    idx = pos.view(B, 1) + torch.arange(T, device=pos.device)  # (B, T): row b's positions
    cache_k[rows, :, idx] = k.transpose(1, 2).to(cache_k.dtype)  # indexed (B, T, kv_heads, hd)
    cache_v[rows, :, idx] = v.transpose(1, 2).to(cache_v.dtype)
    return cache_k, cache_v


def decode_attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                     lengths: torch.Tensor) -> torch.Tensor:
    """One query per sequence q (B, H, hd) against the first lengths[b] cached keys/values (B, kv_heads, L, hd);
    query head h reads kv head h // (H / kv_heads) (grouped-query attention). Returns (B, H, hd)."""
    B, H, D = q.shape
    kvh, L = cache_k.shape[1], cache_k.shape[2]
    if H % kvh:
        raise ValueError(f"decode_attention: {H} query heads cannot share {kvh} kv heads evenly")
    qg = q.reshape(B, kvh, H // kvh, D).to(cache_k.dtype)  # the cache is read once, in its own dtype
    scores = torch.matmul(qg, cache_k.transpose(-1, -2))  # (B, kvh, group, L); softmax in float32 or better
    scores = scores.to(torch.float64 if scores.dtype == torch.float64 else torch.float32) / math.sqrt(D)
    live = torch.arange(L, device=q.device).view(1, 1, 1, L) < lengths.view(B, 1, 1, 1)
    p = torch.softmax(scores.masked_fill(~live, float("-inf")), dim=-1)
    return torch.matmul(p.to(cache_v.dtype), cache_v).reshape(B, H, D).to(q.dtype)
