"""Exercise 14, LLM inference: `update_cache` (write new keys and values at each sequence's own positions) and
`decode_step` (one new token per sequence: cache it, then attend over that sequence's prefix, with GQA)."""
from __future__ import annotations

import math

import torch

from labkit.exercises.inputs import here
from labkit.exercises.observe import expect_tensor, snapshot
from labkit.exercises.spec import Function

NOTEBOOK = "14_llm_inference"
TOL = {torch.float32: 1e-5, torch.float64: 1e-9, torch.bfloat16: 1.6e-2}


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[name]


def _inputs(args: dict) -> dict:
    """Fresh copies on the case's device; k and v are seen through a transpose, as a model's heads are."""
    dev = torch.device(args["device"])
    out = {n: args[n].clone().to(dev) for n in ("cache_k", "cache_v", "pos", "q") if n in args}
    for n in ("k", "v"):  # a chunk (B, T, kv_heads, hd) is passed as its (B, kv_heads, T, hd) view
        out[n] = args[n].to(dev).transpose(1, 2) if args[n].dim() == 4 else args[n].to(dev)
    return out


def call_update_cache(fn, args):
    x = _inputs(args)
    fn(x["cache_k"], x["cache_v"], x["k"], x["v"], x["pos"])
    return {"cache_k": snapshot(x["cache_k"]), "cache_v": snapshot(x["cache_v"])}


def call_decode_step(fn, args):
    x = _inputs(args)
    out = fn(x["q"], x["k"], x["v"], x["cache_k"], x["cache_v"], x["pos"])
    return {"output": snapshot(out), "cache_k": snapshot(x["cache_k"]), "cache_v": snapshot(x["cache_v"])}


def reference_update(cache_k, cache_v, k, v, pos):
    """Loops, in the caches' dtype: row b gets k[b, :, t] at position pos[b] + t."""
    ck, cv = cache_k.clone(), cache_v.clone()
    for b in range(k.shape[0]):
        p = int(pos[b])
        ck[b, :, p:p + k.shape[2]] = k[b]
        cv[b, :, p:p + v.shape[2]] = v[b]
    return ck, cv


def reference_decode(q, k, v, cache_k, cache_v, pos):
    """float64: cache the new token at pos[b], then softmax(q k^T / sqrt(hd)) v over positions 0..pos[b]."""
    ck, cv = reference_update(cache_k, cache_v, k.unsqueeze(2), v.unsqueeze(2), pos)
    B, H, D = q.shape
    g = H // ck.shape[1]
    out = torch.empty(B, H, D, dtype=torch.float64)
    for b in range(B):
        n = int(pos[b]) + 1
        for h in range(H):
            keys, vals = ck[b, h // g, :n].double(), cv[b, h // g, :n].double()
            p = torch.softmax(keys @ q[b, h].double() / math.sqrt(D), dim=0)
            out[b, h] = p @ vals
    return out.to(q.dtype), ck, cv


def update_case(g: torch.Generator, batch: int, kv_heads: int, max_len: int, hd: int, new: int, dtype: str,
                device: str) -> dict:
    """Caches full of old values; each sequence writes `new` tokens at its own random start."""
    dt = _dtype(dtype)
    ck, cv = (torch.randn(batch, kv_heads, max_len, hd, generator=g).to(dt) for _ in range(2))
    k, v = (torch.randn(batch, new, kv_heads, hd, generator=g).to(dt) for _ in range(2))
    pos = torch.randint(0, max_len - new + 1, (batch,), generator=g)
    ek, ev = reference_update(ck, cv, k.transpose(1, 2), v.transpose(1, 2), pos)
    return {"about": f"{batch} sequences, {kv_heads} kv heads of {hd}, {new} new tokens at positions "
                     f"{pos.tolist()} of {max_len}, {dtype}, on {device}",
            "args": {"cache_k": ck, "cache_v": cv, "k": k, "v": v, "pos": pos, "device": device},
            "expected": {"cache_k": expect_tensor(ek, device), "cache_v": expect_tensor(ev, device)},
            "rtol": 0.0, "atol": 0.0}


def decode_case(g: torch.Generator, batch: int, heads: int, kv_heads: int, max_len: int, hd: int, dtype: str,
                device: str) -> dict:
    """Each sequence has its own prefix length; positions past it hold garbage a correct step never reads."""
    dt = _dtype(dtype)
    ck, cv = (torch.randn(batch, kv_heads, max_len, hd, generator=g).mul(3).to(dt) for _ in range(2))
    q = torch.randn(batch, heads, hd, generator=g).to(dt)
    k, v = (torch.randn(batch, kv_heads, hd, generator=g).to(dt) for _ in range(2))
    pos = torch.randint(0, max_len, (batch,), generator=g)
    out, ek, ev = reference_decode(q, k, v, ck, cv, pos)
    tol = TOL[dt]
    return {"about": f"{batch} sequences at positions {pos.tolist()} of {max_len}, {heads} query heads on "
                     f"{kv_heads} kv heads of {hd}, {dtype}, on {device}",
            "args": {"q": q, "k": k, "v": v, "cache_k": ck, "cache_v": cv, "pos": pos, "device": device},
            "expected": {"output": expect_tensor(out, device), "cache_k": expect_tensor(ek, device),
                         "cache_v": expect_tensor(ev, device)},
            "rtol": tol, "atol": tol}


def visible_update_cache() -> list[dict]:
    g, dev = torch.Generator().manual_seed(14), str(here())
    return [update_case(g, 1, 2, 16, 8, 1, "float32", dev), update_case(g, 3, 2, 21, 8, 5, "float32", dev),
            update_case(g, 2, 1, 13, 8, 3, "bfloat16", dev), update_case(g, 1, 2, 9, 4, 2, "float64", dev)]


def visible_decode_step() -> list[dict]:
    g, dev = torch.Generator().manual_seed(41), str(here())
    return [decode_case(g, 2, 4, 4, 19, 8, "float32", dev), decode_case(g, 3, 4, 2, 23, 16, "float32", dev),
            decode_case(g, 2, 4, 1, 17, 8, "bfloat16", dev), decode_case(g, 3, 2, 2, 11, 8, "float64", dev)]


# labkit's own decoder answers this exercise: stubs while it is graded (labkit.grading.answers)
ANSWERS = ("labkit.inference.kvcache.update_cache", "labkit.inference.kvcache.decode_attention")
FUNCTIONS = [Function("update_cache", call_update_cache, visible_update_cache, answers=ANSWERS),
             Function("decode_step", call_decode_step, visible_decode_step, answers=ANSWERS)]
