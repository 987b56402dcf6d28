"""Copies between host and device: a size sweep and the model t = latency + bytes / bandwidth.

A copy of n bytes costs a fixed latency (the call, the driver, setting up the DMA engine)
plus n / bandwidth. Small copies are all latency, large ones all bandwidth;
`fit_latency_bandwidth` finds both from measured points by least squares.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from labkit.device import current
from labkit.timing import Timing, bench, bench_interleaved, threads

DIRECTIONS = {"h2d": "host->device", "d2h": "device->host", "h2h": "host->host (CPU memcpy)"}


@dataclass(frozen=True)
class LinkFit:
    """A fitted copy cost: `latency_us` per copy plus bytes at `bandwidth_gbps` (1 GB = 1e9 B)."""

    latency_us: float
    bandwidth_gbps: float
    max_rel_error: float  # the worst |model - measured| / measured over the fitted points

    def time_ms(self, nbytes):
        """The model's time for `nbytes` (a number or an array) in milliseconds."""
        return self.latency_us * 1e-3 + np.asarray(nbytes, dtype=float) / (self.bandwidth_gbps * 1e6)

    @property
    def half_bandwidth_bytes(self) -> float:
        """The size at which a copy reaches half the bandwidth: latency x bandwidth."""
        return self.latency_us * 1e-6 * self.bandwidth_gbps * 1e9

    def __str__(self) -> str:
        return (f"latency {self.latency_us:.2f} us + bytes / {self.bandwidth_gbps:.2f} GB/s "
                f"(worst point off by {self.max_rel_error:.0%})")


# PCIe transfer rate per lane (GT/s) and line-code efficiency, per generation: the PCI-SIG
# base specifications (gen 1-2: 8b/10b, gen 3-5: 128b/130b, gen 6: 242/256 FLIT).
PCIE_GENERATIONS = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130),
                    5: (32.0, 128 / 130), 6: (64.0, 242 / 256)}


def pcie_peak_gbps(gen: int, width: int) -> float:
    """A PCIe link's peak in one direction, in GB/s: lanes x GT/s x coding efficiency / 8 bits."""
    if gen not in PCIE_GENERATIONS:
        raise ValueError(f"PCIe generation {gen!r} is unknown: use one of {sorted(PCIE_GENERATIONS)}")
    if not isinstance(width, int) or width not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"PCIe link width {width!r} is not a lane count (1, 2, 4, 8, 16 or 32)")
    rate, efficiency = PCIE_GENERATIONS[gen]
    return width * rate * efficiency / 8


def host_cache_bytes(level: int | None = None) -> int:
    """The CPU's largest cache (usually L3), or its cache of `level` (1, 2, 3), in bytes; 0 where the OS does not say.

    A pageable copy's staging memcpy slows once its buffer no longer fits in the largest one.
    """
    if level is not None and level not in (1, 2, 3):
        raise ValueError(f"cache level {level!r}: use 1, 2 or 3 (or None for the largest cache)")
    name = f"SC_LEVEL{level or 3}{'_DCACHE' if level == 1 else ''}_CACHE_SIZE"
    if hasattr(os, "sysconf") and name in os.sysconf_names:
        try:
            if (size := os.sysconf(name)) > 0:
                return int(size)
        except (OSError, ValueError):
            pass
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
            if level is not None and ((index / "level").read_text().strip() != str(level)
                                      or (index / "type").read_text().strip() == "Instruction"):
                continue
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best


def sweep_sizes(lo: int, hi: int, step: int = 4) -> list[int]:
    """Sizes lo, lo*step, lo*step^2, ... up to hi (hi itself always included), in bytes."""
    if lo < 1 or hi < lo or step < 2:
        raise ValueError(f"sweep_sizes needs 1 <= lo <= hi and step >= 2, got lo={lo}, hi={hi}, step={step}")
    sizes = [lo]
    while sizes[-1] * step <= hi:
        sizes.append(sizes[-1] * step)
    if sizes[-1] != hi:
        sizes.append(hi)
    return sizes


def fit_latency_bandwidth(nbytes: Sequence[float], ms: Sequence[float]) -> LinkFit:
    """Least-squares fit of t = latency + bytes / bandwidth to measured (bytes, ms) points.

    The residuals are relative ((model - t) / t), so a 1-byte copy counts as much as a
    1-GiB one; the latency is kept >= 0.
    """
    n = np.asarray(nbytes, dtype=float)
    t = np.asarray(ms, dtype=float)
    if n.shape != t.shape or n.ndim != 1:
        raise ValueError(f"give one time per size: got {n.shape} sizes and {t.shape} times")
    if len(np.unique(n)) < 2:
        raise ValueError("fitting a latency and a bandwidth needs at least two different sizes")
    if not (np.all(np.isfinite(t)) and np.all(t > 0) and np.all(n > 0)):
        raise ValueError("sizes and times must be positive and finite (times in milliseconds)")
    # Divide each row of [1, n] @ [a, b] = t by t: min sum((a/t + b n/t - 1)^2).
    a_mat = np.stack([1 / t, n / t], axis=1)
    (lat, per_byte), *_ = np.linalg.lstsq(a_mat, np.ones_like(t), rcond=None)
    if lat < 0:  # no measurable latency: fit the bandwidth alone
        lat, x = 0.0, n / t
        per_byte = float(x.sum() / (x * x).sum())
    if per_byte <= 0:
        raise ValueError("the times do not grow with size: no bandwidth can be fitted")
    fit = LinkFit(latency_us=float(lat) * 1e3, bandwidth_gbps=1 / float(per_byte) / 1e6, max_rel_error=0.0)
    err = float(np.max(np.abs(fit.time_ms(n) - t) / t))
    return LinkFit(fit.latency_us, fit.bandwidth_gbps, err)


def _check_copy(direction: str, pinned: bool, device: torch.device) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: use one of {', '.join(DIRECTIONS)}")
    if direction == "h2h":
        if pinned:
            raise ValueError("pinned memory only matters for copies to or from a GPU: use pinned=False for 'h2h'")
        return
    if device.type != "cuda":
        raise RuntimeError(f"a {DIRECTIONS[direction]} copy needs a CUDA device, got {device}: "
                           f"use direction='h2h' to time CPU memory copies instead")
    if pinned and not torch.cuda.is_available():
        raise RuntimeError("pinned (page-locked) memory needs a CUDA build of PyTorch and a GPU; "
                           "use pinned=False on a machine without one")


def copy_buffers(nbytes: int, direction: str, pinned: bool = False,
                 device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(source, destination) uint8 buffers of `nbytes` for one copy direction, the source filled."""
    device = torch.device(device) if device is not None else current().device
    _check_copy(direction, pinned, device)
    if nbytes < 1:
        raise ValueError(f"nbytes must be >= 1, got {nbytes}")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    other = torch.empty(nbytes, dtype=torch.uint8, device="cpu" if direction == "h2h" else device)
    src, dst = (other, host) if direction == "d2h" else (host, other)
    src.random_(0, 256)
    dst.fill_(0)  # touch every page now, not during the first timed copy
    return src, dst


def measure_sweep(sizes: Sequence[int], direction: str, pinned: bool = False,
                  device: torch.device | str | None = None, non_blocking: bool = False,
                  progress: Callable | None = None, **bench_kw) -> list[Timing]:
    """Time one copy of each size (views of one buffer of the largest size) with `labkit.bench`.

    `progress` wraps the size list (e.g. `tqdm.auto.tqdm`); `bench_kw` go to `labkit.bench`
    (flush_cache defaults to False: a copy's time does not depend on what the L2 holds).
    """
    sizes = [int(s) for s in sizes]
    if not sizes:
        raise ValueError("give at least one size")
    src, dst = copy_buffers(max(sizes), direction, pinned, device)
    bench_kw.setdefault("flush_cache", False)
    timer_device = "cpu" if direction == "h2h" else device  # a CPU copy is timed on the host clock
    out = []
    for n in (progress(sizes) if progress else sizes):
        s, d = src[:n], dst[:n]
        out.append(bench(lambda d=d, s=s: d.copy_(s, non_blocking=non_blocking), device=timer_device, **bench_kw))
    return out


STAGING_CHUNK = 2**21  # bytes per chunk of our stand-in for the driver's staging buffer (its size is not documented)


def staging_pieces(host: torch.Tensor, ring: torch.Tensor, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(slice of host, slice of ring) pairs that cover host[:n] in order, one ring-sized chunk at a time."""
    if not 1 <= n <= host.numel():
        raise ValueError(f"n must be between 1 and the host buffer's {host.numel()} elements, got {n}")
    step = ring.numel()
    return [(host[o:o + m], ring[:m]) for o in range(0, n, step) for m in [min(step, n - o)]]


def staging_sweep(sizes: Sequence[int], direction: str, chunk: int = STAGING_CHUNK,
                  progress: Callable | None = None, **bench_kw) -> list[Timing]:
    """Time the CPU's half of a pageable copy of each size, on one thread: a memcpy between the pageable buffer
    and one `chunk`-sized buffer (pinned where CUDA is), chunk by chunk, as the driver stages such a copy.

    'h2d' copies pageable -> staging (the source streams from memory, the staging buffer stays in the caches);
    'd2h' copies staging -> pageable. Unlike a copy between two large buffers ('h2h' in `measure_sweep`), only
    the pageable side moves through main memory.
    """
    if direction not in ("h2d", "d2h"):
        raise ValueError(f"direction {direction!r}: staging is for 'h2d' or 'd2h' copies")
    sizes = [int(s) for s in sizes]
    if not sizes or min(sizes) < 1 or chunk < 1:
        raise ValueError(f"give sizes >= 1 and a chunk >= 1 byte, got {sizes} and {chunk}")
    host = torch.empty(max(sizes), dtype=torch.uint8)
    host.random_(0, 256)
    ring = torch.zeros(min(chunk, max(sizes)), dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    out = []
    with threads(1):  # the driver stages a pageable copy with one CPU thread
        for n in (progress(sizes) if progress else sizes):
            pieces = staging_pieces(host, ring, n)
            if direction == "h2d":
                out.append(bench(lambda p=pieces: [r.copy_(h) for h, r in p], device="cpu", **bench_kw))
            else:
                out.append(bench(lambda p=pieces: [h.copy_(r) for h, r in p], device="cpu", **bench_kw))
    return out


def pageable_parts(nbytes: int, device: torch.device | str | None = None, chunk: int = STAGING_CHUNK,
                   rounds: int = 15) -> dict[str, Timing]:
    """A pageable h2d copy of `nbytes`, a pinned copy of as many bytes and the staging memcpy (one thread, as
    `staging_sweep`), timed in turns on the host clock, each call synchronized, one sample a round: a pageable
    copy's model compares the three, and a host's memcpy speed drifts between parts timed at other times."""
    device = torch.device(device) if device is not None else current().device
    if device.type != "cuda":
        raise ValueError(f"pageable_parts needs a CUDA device (pinned memory and a link), got {device}")
    pageable, on_gpu = copy_buffers(nbytes, "h2d", pinned=False, device=device)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).copy_(pageable)
    ring = torch.zeros(min(chunk, nbytes), dtype=torch.uint8, pin_memory=True)
    pieces = staging_pieces(pageable, ring, nbytes)
    calls = {"pageable": lambda: (on_gpu.copy_(pageable), torch.cuda.synchronize(device)),
             "pinned": lambda: (on_gpu.copy_(pinned), torch.cuda.synchronize(device)),
             "staging memcpy": lambda: [r.copy_(h) for h, r in pieces]}
    with threads(1):  # the staging memcpy's one thread; the copies' host side is the driver's
        return bench_interleaved(calls, rounds=rounds, device="cpu", flush_cache=False, min_reps=1)


def count_wrong(got: torch.Tensor, expected: torch.Tensor) -> int:
    """How many elements of `got` differ from `expected` (both read where they are, now)."""
    if got.shape != expected.shape:
        raise ValueError(f"shapes differ: {tuple(got.shape)} vs {tuple(expected.shape)}")
    return int((got != expected.to(got.device)).sum().item())


def timeline(ref, spans: dict[str, tuple]) -> dict[str, tuple[float, float]]:
    """Turn (start, end) CUDA-event pairs into (start_ms, end_ms) after the `ref` event.

    Call it after the events completed (e.g. after torch.cuda.synchronize()).
    """
    return {name: (ref.elapsed_time(s), ref.elapsed_time(e)) for name, (s, e) in spans.items()}


def plot_timeline(ax, spans: dict[str, tuple[float, float]], title: str = "timeline") -> None:
    """One horizontal bar per span, from its start to its end, in milliseconds."""
    names = list(spans)
    colors = [f"C{i}" for i in range(len(names))]
    for i, name in enumerate(names):
        start, end = spans[name]
        ax.barh(i, end - start, left=start, color=colors[i], height=0.6)
        ax.text(end, i, f" {end - start:.2f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("time since the start event (ms)")
    ax.set_title(title)
