"""Static vs continuous (iteration-level) batching of a request stream on a decoder with `slots` cache rows.

Static: take `slots` requests, run until the longest is done, then the next batch (finished rows idle).
Continuous: after every step, a finished row takes the next waiting request (prefilled into that row).
Both run the same fixed-shape decode step over all rows. Used by: notebook 14.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from labkit.inference.decoder import Decoder
from labkit.inference.kvcache import KVCache

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Request:
    """A prompt (1-D token ids) and how many tokens to generate (no early stop: the count is the length)."""

    rid: int
    prompt: torch.Tensor
    max_new: int


@dataclass
class Outcome:
    """What a schedule did: tokens per request, each request's finish time (s from the start), steps, wall time."""

    tokens: dict[int, list[int]] = field(default_factory=dict)
    finish_s: dict[int, float] = field(default_factory=dict)
    first_s: dict[int, float] = field(default_factory=dict)
    steps: int = 0
    wall_s: float = 0.0
    max_active: int = 0

    def throughput(self) -> float:
        """Generated tokens per second of wall time."""
        return sum(len(t) for t in self.tokens.values()) / self.wall_s


def count_steps(max_new: list[int], slots: int, policy: str) -> int:
    """Decode steps a schedule needs (a request's first token comes from its prefill): the model of the speed-up."""
    if policy == "static":
        return sum(max(max_new[i:i + slots]) - 1 for i in range(0, len(max_new), slots))
    left, queue, steps = [], list(max_new), 0
    while queue or left:
        left = [n for n in left if n > 0]
        while queue and len(left) < slots:
            left.append(queue.pop(0) - 1)
        left = [n for n in left if n > 0]
        if left:
            steps += 1
            left = [n - 1 for n in left]
    return steps


def run(dec: Decoder, cache: KVCache, step: Step, requests: list[Request], policy: str,
        sync: Callable[[], None] = lambda: None) -> Outcome:
    """Serve `requests` (all queued at time 0, in order) greedily with `policy` "static" or "continuous"; each
    step's tokens come back to the host, as a server streams them. `sync` waits for the device (timing)."""
    if policy not in ("static", "continuous"):
        raise ValueError(f"batching.run: policy must be 'static' or 'continuous', got {policy!r}")
    slots, dev = cache.batch, cache.device
    for r in requests:
        if len(r.prompt) + r.max_new > cache.max_len or r.max_new < 1:
            raise ValueError(f"request {r.rid}: {len(r.prompt)} + {r.max_new} tokens do not fit the cache's "
                             f"{cache.max_len} positions (or max_new < 1)")
    out, queue = Outcome(), list(requests)
    active: dict[int, Request] = {}  # slot -> request
    tokens, pos = [0] * slots, [0] * slots  # on the host: idle rows sit at position 0 of their own row
    sync()
    t0 = time.perf_counter()

    def admit(slot: int, r: Request) -> None:
        logits = dec(r.prompt.view(1, -1).to(dev), cache, torch.tensor([slot], device=dev))
        first = int(logits[0, -1].argmax())
        out.tokens[r.rid], out.first_s[r.rid] = [first], time.perf_counter() - t0
        tokens[slot], pos[slot] = first, len(r.prompt)
        active[slot] = r

    def retire() -> None:
        for s, r in list(active.items()):
            if len(out.tokens[r.rid]) == r.max_new:
                out.finish_s[r.rid] = time.perf_counter() - t0
                del active[s]
                tokens[s] = pos[s] = 0

    with torch.inference_mode():
        while queue or active:
            if policy == "continuous" or not active:
                for s in range(slots):
                    if s not in active and queue:
                        admit(s, queue.pop(0))
            retire()
            out.max_active = max(out.max_active, len(active))
            if not active:
                continue
            host = step(torch.tensor(tokens, device=dev), torch.tensor(pos, device=dev)).argmax(-1).tolist()
            out.steps += 1
            for s, r in active.items():
                out.tokens[r.rid].append(host[s])
                tokens[s], pos[s] = host[s], pos[s] + 1
            retire()
    sync()
    out.wall_s = time.perf_counter() - t0
    return out
