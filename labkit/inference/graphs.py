"""A decode step with fixed shapes, run eagerly, under torch.compile, or replayed from a CUDA graph.

The step reads every cache position (masked), so its tensors keep their shapes and addresses from step to step:
what a CUDA graph needs. Used by: notebook 14.
"""
from __future__ import annotations

from typing import Callable

import torch

from labkit.inference.decoder import Decoder
from labkit.inference.kvcache import KVCache


class DecodeStep:
    """step(tokens, pos) -> logits for a batch of `cache`'s rows; `mode` "eager", "compile", "graph" (a CUDA graph
    of the eager step) or "compile+graph". Inputs are copied into static buffers; the logits buffer is reused."""

    def __init__(self, dec: Decoder, cache: KVCache, mode: str = "eager"):
        if mode not in ("eager", "compile", "graph", "compile+graph"):
            raise ValueError(f"DecodeStep: mode must be eager, compile, graph or compile+graph, got {mode!r}")
        dev = cache.device
        if "graph" in mode and dev.type != "cuda":
            raise ValueError(f"DecodeStep(mode={mode!r}) captures a CUDA graph: it needs the decoder on a CUDA GPU")
        self.dec, self.cache, self.mode = dec, cache, mode
        B = cache.batch
        self.tokens = torch.zeros(B, dtype=torch.long, device=dev)
        self.pos = torch.zeros(B, dtype=torch.long, device=dev)
        fn: Callable = self._eager
        if "compile" in mode:
            fn = torch.compile(self._eager, dynamic=False, fullgraph=True)
        self.fn, self.graph, self.logits = fn, None, None
        if "graph" in mode:
            self._capture()

    def _eager(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.dec.step(tokens, pos, self.cache)

    def _capture(self) -> None:
        saved = [t.clone() for t in (*self.cache.k, *self.cache.v)]  # warm-up and capture write into the cache
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(3):
                self.fn(self.tokens, self.pos)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.logits = self.fn(self.tokens, self.pos)
        for t, old in zip((*self.cache.k, *self.cache.v), saved):
            t.copy_(old)

    def __call__(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.pos.copy_(pos)
        if self.graph is None:
            with torch.no_grad():
                return self.fn(self.tokens, self.pos)
        self.graph.replay()
        return self.logits
