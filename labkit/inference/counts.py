"""Bytes and FLOPs of one decoder's prefill and decode step, counted from its sizes (no measurement).

Per decode step of b sequences: all the weights are read once (W bytes), each sequence reads its cached keys
and values (2 x layers x kv_heads x head_dim x bytes per cached token), and does 2 FLOPs per weight.
Used by: notebook 14.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.capstone.model import GPTConfig


@dataclass(frozen=True)
class Counts:
    """A GPT's sizes as inference sees them: kv_heads (heads: MHA, 1: MQA), bytes per weight and per cached value."""

    cfg: GPTConfig
    kv_heads: int
    weight_bytes_each: float = 2.0
    kv_bytes_each: float = 2.0

    def linear_params(self) -> int:
        """Weights read per token: q, k, v, proj, the MLP and the head (embeddings read one row: left out)."""
        c, d, hd = self.cfg, self.cfg.d_model, self.cfg.head_dim
        per_layer = d * d + 2 * d * self.kv_heads * hd + d * d + 2 * d * c.hidden
        return c.layers * per_layer + d * c.vocab

    def weight_bytes(self) -> float:
        return self.linear_params() * self.weight_bytes_each

    def kv_bytes_per_token(self) -> float:
        """2 (k and v) x layers x kv_heads x head_dim x bytes: what each cached token costs, read every step."""
        return 2 * self.cfg.layers * self.kv_heads * self.cfg.head_dim * self.kv_bytes_each

    def decode_bytes(self, batch: int, context: int) -> float:
        """One decode step of `batch` sequences that each read `context` cached tokens."""
        return self.weight_bytes() + batch * context * self.kv_bytes_per_token()

    def decode_flops(self, batch: int, context: int) -> float:
        """2 per weight per sequence, plus q.k and p.v over the context (4 x heads x head_dim per cached token)."""
        attn = 4 * self.cfg.layers * self.cfg.heads * self.cfg.head_dim * context
        return batch * (2 * self.linear_params() + attn)

    def prefill_flops(self, batch: int, tokens: int) -> float:
        """The matmuls over every prompt token, plus causal attention (half of the tokens x tokens scores)."""
        attn = 2 * self.cfg.layers * self.cfg.heads * self.cfg.head_dim * tokens * tokens
        return batch * (2 * self.linear_params() * tokens + attn)

    def prefill_bytes(self, batch: int, tokens: int) -> float:
        """The weights once, and the keys and values written for every prompt token."""
        return self.weight_bytes() + batch * tokens * self.kv_bytes_per_token()


def paged_kv_tokens(lengths: list[int], max_len: int, block: int) -> tuple[int, int, int]:
    """Cache slots held for sequences of `lengths`: (used tokens, contiguous max_len per sequence, paged blocks of
    `block` tokens). Contiguous reserves the worst case; paging holds ceil(len / block) blocks."""
    used = sum(lengths)
    return used, max_len * len(lengths), sum(math.ceil(n / block) * block for n in lengths)
