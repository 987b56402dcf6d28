"""A small GPT (pre-norm transformer, learned positions, causal attention), one class for every variant.

Model FLOPs per token (forward + backward = 3 x forward, counted on the unpadded sizes):
6 x (matmul weights: L·(4d² + 2d·ffn) + d·V) + 6·L·T·d for causal attention (q kᵀ and p v, half the
T x T scores). Padding the vocabulary and the MLP's hidden size (`pad`) adds zero rows and columns
that never change (their gradients are exactly zero), so the padded model computes the same function.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTIONS = ("naive", "sdpa", "flash")


@dataclass(frozen=True)
class GPTConfig:
    """Sizes: vocabulary, context length, width, heads, blocks and MLP hidden size (default 8/3 of the width)."""

    vocab: int
    seq: int = 64
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    ffn: int = 0

    @property
    def hidden(self) -> int:
        return self.ffn or round(8 * self.d_model / 3)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def matmul_params(self) -> int:
        d = self.d_model
        return self.layers * (4 * d * d + 2 * d * self.hidden) + d * self.vocab

    def flops_per_token(self) -> float:
        return 6.0 * self.matmul_params() + 6.0 * self.layers * self.seq * self.d_model


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, hidden: int, attention: str):
        super().__init__()
        d = cfg.d_model
        self.heads, self.attention = cfg.heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.register_buffer("mask", torch.ones(cfg.seq, cfg.seq, dtype=torch.bool).tril(), persistent=False)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.attention == "naive":  # as a beginner writes it: the T x T scores and probabilities in memory
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            y = torch.softmax(att, dim=-1) @ v
        elif self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            from labkit.kernels import attention
            if q.dtype not in (torch.float16, torch.bfloat16):
                raise TypeError("GPT(attention='flash') runs labkit's FlashAttention, which takes fp16/bf16: "
                                "train under torch.autocast(dtype=torch.bfloat16).")
            y = attention(q, k, v, causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """GPT(cfg, attention, pad, seed): `pad` rounds the vocabulary and MLP hidden size up to a multiple
    (1: no padding). The weights are drawn on the CPU from `seed`, so every variant starts identical."""

    def __init__(self, cfg: GPTConfig, attention: str = "naive", pad: int = 1, seed: int = 0):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"GPT: attention must be one of {ATTENTIONS}, got {attention!r}")
        if cfg.d_model % cfg.heads:
            raise ValueError(f"GPT: d_model {cfg.d_model} must be a multiple of heads {cfg.heads}")
        self.cfg, self.pad = cfg, pad
        vocab_p, hidden_p = _round_up(cfg.vocab, pad), _round_up(cfg.hidden, pad)
        self.tok = nn.Embedding(vocab_p, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, hidden_p, attention) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_p, bias=False)
        self._init(seed)

    @torch.no_grad()
    def _init(self, seed: int) -> None:
        """N(0, 0.02) weights, zero biases, drawn at the unpadded shapes; padding stays zero."""
        g = torch.Generator().manual_seed(seed)
        c = self.cfg
        for name, p in self.named_parameters():
            if name.endswith("bias") or ".ln" in name or name.startswith("ln_f"):
                p.copy_(torch.ones_like(p) if "ln" in name and name.endswith("weight") else torch.zeros_like(p))
                continue
            real = [min(s, full) for s, full in zip(self._real_shape(name, p.shape), p.shape)]
            w = torch.randn(real, generator=g) * 0.02
            if name.endswith("out.weight") or name.endswith("proj.weight"):
                w /= math.sqrt(2 * c.layers)  # residual projections, as GPT-2 scales them
            p.zero_()
            p[tuple(slice(0, s) for s in real)] = w

    def _real_shape(self, name: str, shape: torch.Size) -> list[int]:
        c = self.cfg
        if name == "tok.weight" or name == "head.weight":
            return [c.vocab, c.d_model]
        if name.endswith("fc.weight"):
            return [c.hidden, c.d_model]
        if name.endswith("out.weight"):
            return [c.d_model, c.hidden]
        return list(shape)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab) or, with targets, the mean cross-entropy loss."""
        T = idx.shape[1]
        x = self.tok(idx) + self.pos.weight[:T]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))[..., :self.cfg.vocab]
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().reshape(-1, self.cfg.vocab), targets.reshape(-1))
