"""A decoder over the capstone GPT's own weights: prefill a prompt into a KV cache, then one token per step.

kv_heads < heads gives grouped-query attention (1: multi-query), made from the GPT's weights by averaging the
key and value projections of each group of heads (as GQA checkpoints are converted from MHA ones).
Used by: notebook 14, exercise 14.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.capstone.model import GPT
from labkit.inference.kvcache import KVCache, decode_attention, update_cache
from labkit.inference.quant import FP8, quantized_copy


def _linear(w: torch.Tensor, b: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    return lin


class Layer(nn.Module):
    """One GPT block split into q, k, v projections (k and v with kv_heads heads), the output and the MLP."""

    def __init__(self, block: nn.Module, heads: int, kv_heads: int):
        super().__init__()
        d = block.qkv.in_features
        hd = d // heads
        w, b = block.qkv.weight.detach(), block.qkv.bias.detach()
        wq, wk, wv = w.split(d)
        bq, bk, bv = b.split(d)
        g = heads // kv_heads

        def pool(t: torch.Tensor) -> torch.Tensor:  # average each group of g heads' rows
            return t.reshape(kv_heads, g, hd, *t.shape[1:]).mean(1).reshape(kv_heads * hd, *t.shape[1:])

        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        self.q = _linear(wq, bq)
        self.k, self.v = _linear(pool(wk), pool(bk)), _linear(pool(wv), pool(bv))
        self.proj, self.fc, self.out = (copy.deepcopy(m) for m in (block.proj, block.fc, block.out))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(self.ln2(x))))


class Decoder(nn.Module):
    """Decoder(gpt, kv_heads): the GPT's weights as prefill + decode steps. `int8()`/`fp8()`: weight-only copies."""

    def __init__(self, gpt: GPT, kv_heads: int | None = None):
        super().__init__()
        c = gpt.cfg
        self.cfg, self.heads = c, c.heads
        self.kv_heads = kv_heads or c.heads
        if c.heads % self.kv_heads:
            raise ValueError(f"Decoder: kv_heads={self.kv_heads} must divide the GPT's {c.heads} heads "
                             f"(e.g. {c.heads}: MHA, 1: MQA)")
        self.head_dim = c.head_dim
        self.tok, self.pos = copy.deepcopy(gpt.tok), copy.deepcopy(gpt.pos)
        self.layers = nn.ModuleList(Layer(b, c.heads, self.kv_heads) for b in gpt.blocks)
        self.ln_f, self.head = copy.deepcopy(gpt.ln_f), copy.deepcopy(gpt.head)

    def int8(self) -> Decoder:
        """A copy whose every linear layer holds int8 weights and per-row scales (in this decoder's dtype)."""
        return quantized_copy(copy.deepcopy(self), self.tok.weight.dtype)

    def fp8(self) -> Decoder:
        """A copy whose every linear layer holds fp8 (e4m3) weights and per-row scales (in this decoder's dtype)."""
        return quantized_copy(copy.deepcopy(self), self.tok.weight.dtype, FP8)

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        w = self.tok.weight
        return KVCache.empty(self.cfg.layers, batch, self.kv_heads, max_len or self.cfg.seq, self.head_dim,
                             w.dtype, w.device)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))[..., :self.cfg.vocab]

    def _split(self, layer: Layer, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = h.shape
        q = layer.q(h).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = layer.k(h).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = layer.v(h).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None, slots: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Prefill: logits (B, T, vocab) of prompts idx (B, T) from position 0, recomputing everything; with a
        cache, also writes the prompts' keys and values into its rows `slots` (default 0..B-1)."""
        B, T = idx.shape
        if T > self.cfg.seq:
            raise ValueError(f"Decoder: {T} tokens exceed the GPT's {self.cfg.seq} positions")
        x = self.tok(idx) + self.pos.weight[:T]
        rows = slots if slots is not None else torch.arange(B, device=idx.device)
        for i, layer in enumerate(self.layers):
            q, k, v = self._split(layer, layer.ln1(x))
            if cache is not None:
                cache.k[i][rows, :, :T] = k.to(cache.k[i].dtype)
                cache.v[i][rows, :, :T] = v.to(cache.v[i].dtype)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
            x = x + layer.proj(y.transpose(1, 2).reshape(B, T, -1))
            x = x + layer.mlp(x)
        return self._logits(x)

    def step(self, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache, upto: int | None = None) -> torch.Tensor:
        """One decode step: tokens (B,) at positions pos (B,), each sequence's own; writes their keys and values into
        the cache and attends over positions 0..pos[b]. Reads cache positions < upto (default all: fixed shapes,
        so the step can be captured in a CUDA graph). Returns logits (B, vocab)."""
        B = tokens.shape[0]
        x = (self.tok(tokens) + self.pos(pos)).view(B, 1, -1)
        L = upto or cache.max_len
        for i, layer in enumerate(self.layers):
            q, k, v = self._split(layer, layer.ln1(x))
            ck, cv = update_cache(cache.k[i], cache.v[i], k, v, pos)
            y = decode_attention(q.reshape(B, self.heads, self.head_dim), ck[:, :, :L], cv[:, :, :L], pos + 1)
            x = x + layer.proj(y.reshape(B, 1, -1))
            x = x + layer.mlp(x)
        return self._logits(x).view(B, -1)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, n: int, use_cache: bool = True) -> torch.Tensor:
        """Greedy: n new tokens (B, n) after prompt (B, T); without the cache every token recomputes the prefix."""
        B, T = prompt.shape
        if T + n > self.cfg.seq:
            raise ValueError(f"Decoder.generate: {T} + {n} tokens exceed the GPT's {self.cfg.seq} positions")
        if not use_cache:
            seq = prompt
            for _ in range(n):
                seq = torch.cat([seq, self(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
            return seq[:, T:]
        cache = self.new_cache(B, T + n)
        out = [self(prompt, cache)[:, -1].argmax(-1)]
        pos = torch.full((B,), T, dtype=torch.long, device=prompt.device)
        for _ in range(n - 1):
            out.append(self.step(out[-1], pos, cache, upto=int(pos[0]) + 1).argmax(-1))
            pos += 1
        return torch.stack(out, dim=1)
