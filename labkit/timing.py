"""One benchmark helper for the whole course: warm-up, repeated samples, median and spread.

On a GPU each sample is timed with CUDA events (the host clock would time only the launch);
on the CPU with `time.perf_counter`. The method follows `triton.testing.do_bench`: estimate,
warm up, then time each call separately, flushing the L2 cache before each one by default.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterator, Mapping

import torch

from labkit.device import current, gpu_index
from labkit.stats import HostLoad, Samples, quantile


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call: the median, the 20th/80th percentiles and every sample."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    n: int
    samples: list[float] = field(repr=False, default_factory=list)
    host_busy: float | None = field(default=None, compare=False)  # others' share of the CPU while timed (stats)

    @property
    def median_us(self) -> float:
        return self.median_ms * 1e3

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: 0.05 means the middle 60% of samples lie within 5%."""
        return (self.p80_ms - self.p20_ms) / self.median_ms if self.median_ms > 0 else 0.0

    def as_samples(self) -> Samples:
        """The samples (ms) as `labkit.Samples`, which claims resample (labkit.stats)."""
        return Samples.of(self.samples or [self.median_ms], self.host_busy)

    def map(self, f: Callable[[float], float]) -> Samples:
        """Every sample in another unit, e.g. `t.map(lambda ms: labkit.gbps(nbytes, ms))` for GB/s."""
        return self.as_samples().map(f)

    def __str__(self) -> str:
        return (f"{format_ms(self.median_ms)} (p20-p80 {format_ms(self.p20_ms)}-{format_ms(self.p80_ms)}, "
                f"n={self.n})")


def format_ms(ms: float) -> str:
    """1.5 -> '1.500 ms', 0.012 -> '12.0 us'."""
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def summarize(samples: list[float]) -> Timing:
    """A `Timing` from raw per-call samples in milliseconds."""
    if not samples:
        raise ValueError("no samples to summarize")
    return Timing(statistics.median(samples), quantile(samples, 0.2), quantile(samples, 0.8),
                  len(samples), list(samples))


_l2_flush: dict[int, torch.Tensor] = {}


def flush_l2(device: torch.device) -> None:
    """Overwrite a 256 MiB buffer so the next kernel starts with a cold L2 cache."""
    index = gpu_index(device)
    if index not in _l2_flush:
        _l2_flush[index] = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=device)
    _l2_flush[index].zero_()


def bench(fn: Callable[[], object], *, warmup_ms: float = 25.0, rep_ms: float = 100.0,
          min_reps: int = 5, max_reps: int = 10_000, flush_cache: bool = True,
          cuda_graph: bool = False, device: torch.device | str | None = None, max_s: float = 30.0) -> Timing:
    """Time `fn()`: warm up for `warmup_ms`, then sample it for about `rep_ms`.

    flush_cache: on a GPU, start each sample with a cold L2 (as `do_bench` does).
    cuda_graph: capture many calls in one CUDA graph and time its replays, so launch overhead
    drops out; use it for kernels of a few microseconds.
    max_s: a call slower than `rep_ms` is timed in fewer samples (at least one) so that the whole
    benchmark stays within about `max_s` seconds; it says so in one line.
    """
    device = torch.device(device) if device is not None else current().device
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"bench(device={str(device)!r}): PyTorch sees no CUDA GPU here; time on the CPU "
                           f"(device='cpu', or leave device unset to use labkit.setup()'s choice).")
    if cuda_graph and device.type != "cuda":
        raise ValueError("cuda_graph=True needs a CUDA device; this benchmark runs on the CPU.")
    load = HostLoad()  # what other processes took while this ran: a claim on a busy host is undecided
    if device.type == "cuda":
        t = (_bench_graph(fn, device, warmup_ms, rep_ms, min_reps, max_reps) if cuda_graph else
             _bench_events(fn, device, warmup_ms, rep_ms, min_reps, max_reps, flush_cache, max_s))
    else:
        t = _bench_host(fn, warmup_ms, rep_ms, min_reps, max_reps, max_s)
    object.__setattr__(t, "host_busy", load.others_share())
    return t


def bench_interleaved(fns: Mapping[str, Callable[[], object]], *, rounds: int = 20, rep_ms: float = 100.0,
                      warmup_ms: float = 25.0, **options: object) -> dict[str, Timing]:
    """Time several calls in alternating rounds (A B, B A, ...), each `rep_ms / rounds` a round, pooling the samples.

    Use it where a claim compares the calls: a change in the machine's speed while they are timed (another
    tenant, clocks, a thread that wakes now and then) then falls on all of them alike instead of on whichever ran
    last. Only the first round warms up. `options` go to `bench`.
    """
    if not fns:
        raise ValueError("bench_interleaved() needs at least one call to time, e.g. {'small': f, 'large': g}")
    if rounds < 1:
        raise ValueError(f"bench_interleaved(rounds={rounds}): use at least 1 round")
    pooled: dict[str, list[float]] = {k: [] for k in fns}
    busy: dict[str, list[float]] = {k: [] for k in fns}
    labels = list(fns)
    for r in range(rounds):
        for label in labels if r % 2 == 0 else labels[::-1]:
            t = bench(fns[label], rep_ms=rep_ms / rounds, warmup_ms=warmup_ms if r == 0 else 0.0,
                      **options)  # type: ignore[arg-type]
            pooled[label] += t.samples or [t.median_ms]
            if t.host_busy is not None:
                busy[label].append(t.host_busy)
    out = {}
    for label, samples in pooled.items():
        t = summarize(samples)
        object.__setattr__(t, "host_busy", max(busy[label]) if busy[label] else None)
        out[label] = t
    return out


def bench_each(fns: Mapping[Hashable, Callable[[], object]], *, interleave: bool | None = None,
               **options: object) -> dict[Hashable, Timing]:
    """Time several calls that a claim compares: {label: call} -> {label: Timing}; `options` go to `bench`.

    interleave=None alternates them (`bench_interleaved`) on a CPU, whose speed drifts while other tenants share
    the machine, and times each in one block on a GPU, as the course's GPU reference runs were measured.
    """
    if interleave is None:
        device = options.get("device")
        interleave = (torch.device(device) if device is not None else current().device).type != "cuda"
    if interleave:
        return bench_interleaved(fns, **options)
    return {label: bench(fn, **options) for label, fn in fns.items()}  # type: ignore[arg-type]


def _slow(first_ms: float, rep_ms: float, min_reps: int, max_s: float, timed) -> Timing | None:
    """For a call slower than `rep_ms`: sample it as often as fits in `max_s`, at least once, saying so
    when it takes long; None for a fast call, which the normal path times. The first call may have
    compiled or autotuned, so a second (warm) call decides, and is the first sample."""
    if first_ms <= rep_ms:
        return None
    again = timed()
    if again <= rep_ms:
        return None
    n = max(1, min(min_reps, int(max_s * 1e3 / again) - 1))
    if n < min_reps or n * again > 5e3:  # worth a line only when it is long, or capped
        print(f"bench: one call takes {format_ms(again)}; timing {n} sample(s), about "
              f"{n * again / 1e3:.0f} s (max_s={max_s:g} caps it).", flush=True)
    return summarize([again] + [timed() for _ in range(n - 1)])


def _reps(estimate_ms: float, budget_ms: float, min_reps: int, max_reps: int) -> int:
    return int(min(max_reps, max(min_reps, budget_ms / max(estimate_ms, 1e-6))))


def _host_call_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _bench_host(fn, warmup_ms, rep_ms, min_reps, max_reps, max_s) -> Timing:
    first = _host_call_ms(fn)
    if (slow := _slow(first, rep_ms, min_reps, max_s, lambda: _host_call_ms(fn))) is not None:
        return slow
    estimate = _host_call_ms(fn)
    deadline = time.perf_counter() + warmup_ms / 1e3
    for _ in range(_reps(estimate, warmup_ms, 1, max_reps)):
        fn()
        if time.perf_counter() > deadline:
            break
    # The first calls may have been unusually fast: stop at twice the budget whatever the count.
    samples, deadline = [], time.perf_counter() + 2 * rep_ms / 1e3
    for _ in range(_reps(estimate, rep_ms, min_reps, max_reps)):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
        if len(samples) >= min_reps and t0 > deadline:
            break
    return summarize(samples)


def _bench_events(fn, device, warmup_ms, rep_ms, min_reps, max_reps, flush_cache, max_s) -> Timing:
    with torch.cuda.device(device):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        first = (time.perf_counter() - t0) * 1e3

        def timed() -> float:
            if flush_cache:
                flush_l2(device)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            return s.elapsed_time(e)

        if (slow := _slow(first, rep_ms, min_reps, max_s, timed)) is not None:
            return slow
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            if flush_cache:
                flush_l2(device)
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate = start.elapsed_time(end) / 5
        for _ in range(_reps(estimate, warmup_ms, 1, max_reps)):
            fn()
        n = _reps(estimate, rep_ms, min_reps, max_reps)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for s, e in zip(starts, ends):
            if flush_cache:
                flush_l2(device)
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return summarize([s.elapsed_time(e) for s, e in zip(starts, ends)])


def _bench_graph(fn, device, warmup_ms, rep_ms, min_reps, max_reps) -> Timing:
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        # How long is one call? Time a graph of 10 calls, then size the real graph to ~ rep_ms/20.
        probe = _capture(fn, 10, side)  # on the warm-up's stream: autograd runs a backward there
        probe.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        probe.replay()
        end.record()
        torch.cuda.synchronize()
        per_call = max(start.elapsed_time(end) / 10, 1e-4)
        calls = max(1, min(1000, int(rep_ms / 20 / per_call)))
        graph = _capture(fn, calls, side)
        for _ in range(_reps(per_call * calls, warmup_ms, 1, max_reps)):
            graph.replay()
        n = _reps(per_call * calls, rep_ms, min_reps, max_reps)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for s, e in zip(starts, ends):
            s.record()
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        return summarize([s.elapsed_time(e) / calls for s, e in zip(starts, ends)])


def _capture(fn, calls: int, stream) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` calls of fn, captured on `stream`."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
    except Exception:
        # A capture that CUDA itself failed (a sync, work on another stream) leaves torch's CUDA random generator
        # marked as capturing, and every random op after it fails; a capture that succeeds clears the mark.
        tidy, x = torch.cuda.CUDAGraph(), torch.zeros(1, device=torch.cuda.current_device())
        with torch.cuda.graph(tidy, stream=stream):
            x.add_(1.0)
        raise
    return graph


def gbps(nbytes: float, ms: float) -> float:
    """Bytes moved in `ms` milliseconds, as GB/s (1 GB = 1e9 bytes)."""
    return nbytes / ms / 1e6


def tflops(flops: float, ms: float) -> float:
    """Floating-point operations done in `ms` milliseconds, as TFLOP/s."""
    return flops / ms / 1e9


def sync(device: torch.device | str) -> None:
    """Wait for `device` to finish its queued work (nothing to wait for on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[None]:
    """torch's CPU threads set to `n` inside the block (left as they are for None), restored after."""
    if n is None:
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)
