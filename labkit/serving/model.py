"""The served model and its runner: host inputs in, host outputs out, optionally bf16, compiled, CUDA-graphed.

The model is a stack of square linear layers: its weights dominate its memory traffic, so at small
batches it is bandwidth-bound (like a language model decoding), and a batch costs little more than one.
Per sample it does 2 * (d_in*width + depth*width^2 + width*d_out) FLOPs; per batch it reads every weight once.

Used by: notebook 12.
"""
from __future__ import annotations

import time
from typing import Iterable

import torch
from torch import nn


def make_model(d_in: int = 64, width: int = 1024, depth: int = 4, d_out: int = 16, seed: int = 0,
               device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Linear(d_in, width), `depth` x [Linear(width, width), GELU], Linear(width, d_out), drawn on `device`.

    The weights are drawn with a generator on `device` (fast for billions of them), so they match for
    one seed on one kind of device; to compare devices, copy one model (`copy.deepcopy(m).to("cpu")`).
    """
    layers: list[nn.Module] = [nn.Linear(d_in, width, device="meta")]
    for _ in range(depth):
        layers += [nn.Linear(width, width, device="meta"), nn.GELU()]
    layers.append(nn.Linear(width, d_out, device="meta"))
    model = nn.Sequential(*layers).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else p.shape[0]
            p.uniform_(-1, 1, generator=gen).mul_(fan_in ** -0.5)
    return model.to(dtype).eval()


def flops_per_sample(d_in: int, width: int, depth: int, d_out: int) -> int:
    return 2 * (d_in * width + depth * width * width + width * d_out)


def weight_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class Runner:
    """Call it with a host float32 batch [b, d_in]; returns host float32 [b, d_out] (the transfers counted).

    On a GPU, `graphs` lists the batch sizes to capture as CUDA graphs (static input and output
    buffers, replayed with one launch); other sizes run eagerly. `compile` wraps the model in torch.compile.
    """

    def __init__(self, model: nn.Module, device: str | torch.device, dtype: torch.dtype = torch.float32,
                 compile: bool = False, graphs: Iterable[int] = ()):
        self.device, self.dtype = torch.device(device), dtype
        self.model = model.to(self.device, dtype).eval()
        self.fn = torch.compile(self.model) if compile else self.model
        self.d_in = next(self.model.parameters()).shape[-1]
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        sizes = sorted(set(graphs))
        if sizes and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; pass graphs=() on the CPU")
        for b in sizes:
            self.graphs[b] = self._capture(b)

    def _capture(self, b: int):
        static_in = torch.zeros(b, self.d_in, device=self.device, dtype=self.dtype)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(3):  # warm up (and compile) outside the graph
                self.fn(static_in)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.inference_mode():
            static_out = self.fn(static_in)
        return graph, static_in, static_out

    def warm(self, sizes: Iterable[int], reps: int = 2) -> None:
        """Run each batch size `reps` times on random inputs: a shape's first eager run (cuBLAS picking its
        kernels, allocator growth) is many times slower than the next, and must not land on a request."""
        for b in sorted(set(sizes)):
            x = torch.randn(b, self.d_in)
            for _ in range(reps):
                self(x)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.d_in:
            raise ValueError(f"expected a batch of shape [b, {self.d_in}], got {tuple(x.shape)}")
        with torch.inference_mode():
            graphed = self.graphs.get(x.shape[0])
            if graphed is not None:
                graph, static_in, static_out = graphed
                static_in.copy_(x, non_blocking=False)
                graph.replay()
                out = static_out
            else:
                out = self.fn(x.to(self.device, self.dtype))
            return out.float().cpu()


class FixedTime:
    """A stand-in model that takes `ms` per call whatever the batch size (it sleeps): tests the serving path alone.

    Row i of the answer is the sum of input row i, repeated `d_out` times, so a test can check who got what.
    """

    def __init__(self, ms: float, d_out: int = 16):
        if ms < 0 or d_out < 1:
            raise ValueError(f"need ms >= 0 and d_out >= 1, got ms={ms}, d_out={d_out}")
        self.ms, self.d_out = ms, d_out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
        return x.sum(1, keepdim=True).expand(-1, self.d_out).clone()


def gpu_kernel_names(fn, x: torch.Tensor) -> list[str]:
    """Names of the GPU kernels (and copies) one call `fn(x)` runs, from torch.profiler (a CUDA device only)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn(x)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
