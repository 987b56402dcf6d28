"""A decode step with fixed shapes, run eagerly, under torch.compile, or replayed from a CUDA graph; how many
kernels a call runs (counted), the time floor of one tiny kernel (measured), and the step's parts to time alone.

The step reads every cache position (masked), so its tensors keep their shapes and addresses from step to step:
what a CUDA graph needs. Used by: notebook 14.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from labkit.inference.decoder import Decoder
from labkit.inference.kvcache import KVCache, decode_attention
from labkit.stats import Samples
from labkit.timing import bench


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

    def count(self, tokens: torch.Tensor, pos: torch.Tensor) -> int:
        """Kernels one step runs on a GPU (the graph replays exactly these), or operators on the CPU: counted by
        running the step once outside any graph (inputs copied in as a call does) under torch.profiler."""
        def once() -> None:
            self.tokens.copy_(tokens)
            self.pos.copy_(pos)
            with torch.no_grad():
                self.fn(self.tokens, self.pos)
        return count_kernels(once, self.cache.device)


def count_kernels(fn: Callable[[], object], device: torch.device | str) -> int:
    """How many GPU kernels (and device copies) one call of fn runs, counted with torch.profiler; on the CPU, how
    many top-level operators it calls (each pays the dispatcher once)."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    fn()  # warm: lazy initialisation and autotuning are not part of a call
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        fn()
        sync()
    if cuda:
        n = sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
    else:
        n = sum(1 for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::"))
    if n == 0:
        raise RuntimeError(f"count_kernels: the profiler saw no {'GPU kernel' if cuda else 'operator'} in one call; "
                           f"check that fn runs work on {dev} (on a GPU, that CUPTI is installed with the driver)")
    return n


def op_floor(device: torch.device | str, graph: bool, width: int = 2048) -> Samples:
    """Time per tiny operation (an add on `width` numbers): replayed from a CUDA graph (the GPU's own floor per
    kernel, launches excluded) or launched one by one from Python (the host's cost per operation)."""
    dev = torch.device(device)
    x = torch.zeros(width, device=dev)
    if graph:
        return bench(lambda: x.add_(1), cuda_graph=True, warmup_ms=10, rep_ms=100, device=dev).as_samples()
    per = 100

    def chain() -> None:
        for _ in range(per):
            x.add_(1)
    return bench(chain, flush_cache=False, warmup_ms=10, rep_ms=100, device=dev).map(lambda ms: ms / per)


def step_parts(dec: Decoder, cache: KVCache, lengths: torch.Tensor) -> dict[str, tuple[Callable[[], object], int]]:
    """The decode step's two heavy parts as calls to time alone, with the bytes each must read: "products" (every
    layer's linear layers and the head, each on its own weights, as in the step) and "attention" (every layer's one
    query per row against its cache, `lengths` live positions per row)."""
    dt, B, dev = dec.tok.weight.dtype, cache.batch, cache.device
    linears = [m for layer in dec.layers for m in (layer.q, layer.k, layer.v, layer.proj, layer.fc, layer.out)]
    linears.append(dec.head)
    weights = [m.weight if isinstance(m, torch.nn.Linear) else m.q for m in linears]  # nn.Linear or QuantLinear
    ins = {w.shape[1]: torch.randn(B, 1, w.shape[1], device=dev, dtype=dt) for w in weights}
    q = torch.randn(B, dec.heads, dec.head_dim, device=dev, dtype=dt)

    def products() -> None:
        for m, w in zip(linears, weights):
            m(ins[w.shape[1]])

    def attention() -> None:
        for k, v in zip(cache.k, cache.v):
            decode_attention(q, k, v, lengths)

    return {"products": (products, sum(w.numel() * w.element_size() for w in weights)),
            "attention": (attention, cache.nbytes())}
