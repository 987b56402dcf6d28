"""This machine's measured ceilings: copy bandwidth, matmul rate, host-device bandwidth.

Measured once per machine (and per quick/full mode) and cached as JSON under
$LABKIT_CACHE (default ~/.cache/labkit), so every notebook states its numbers as a
fraction of what this machine can actually do, not of a datasheet.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from labkit.device import cache_dir, current, machine_info
from labkit.precision import PRECISIONS, matmul_rate
from labkit.timing import bench, gbps
from labkit.transfer import measure_sweep

@dataclass
class Ceilings:
    """Measured peaks; bandwidths in GB/s, matmul rates in TFLOP/s."""

    machine: str
    copy_gbps: float  # device copy, bytes read + bytes written
    matmul_tflops: dict[str, float] = field(default_factory=dict)  # per dtype name
    h2d_gbps: dict[str, float] = field(default_factory=dict)  # "pinned"/"pageable" -> GB/s
    d2h_gbps: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # problem sizes they were measured at

    def copy_fraction(self, achieved_gbps: float) -> float:
        return achieved_gbps / self.copy_gbps

    def matmul_fraction(self, achieved_tflops: float, dtype: str = "fp32") -> float:
        return achieved_tflops / self.matmul_tflops[dtype]

    def ridge(self, dtype: str = "fp32") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from bandwidth to compute."""
        return self.matmul_tflops[dtype] * 1e12 / (self.copy_gbps * 1e9)

    def table(self) -> str:
        rows = [("device copy (read + write)", f"{self.copy_gbps:,.0f} GB/s")]
        rows += [(f"matmul {k} ({self.sizes.get('matmul')}^3)", f"{v:,.2f} TFLOP/s")
                 for k, v in self.matmul_tflops.items()]
        rows += [(f"host->device {k}", f"{v:,.1f} GB/s") for k, v in self.h2d_gbps.items()]
        rows += [(f"device->host {k}", f"{v:,.1f} GB/s") for k, v in self.d2h_gbps.items()]
        width = max(len(r[0]) for r in rows)
        return "\n".join(f"{a:<{width}}  {b}" for a, b in [(f"ceilings of {self.machine}", "")] + rows)


def _machine_key() -> tuple[str, str]:
    info = machine_info()
    name = info["GPU"] if current().is_gpu else f"CPU {info['CPU']} x{info['CPU cores']}"
    facts = [name, info["torch"], info.get("driver", ""), str(current().quick)]
    return name, hashlib.sha1("|".join(facts).encode()).hexdigest()[:12]


def measure_copy_gbps(nbytes: int) -> float:
    """Device-to-device copy bandwidth (bytes read plus bytes written)."""
    dev = current().device
    src = torch.randn(nbytes // 4, device=dev)
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src))
    return gbps(2 * src.numel() * 4, t.median_ms)


def measure_matmul_tflops(n: int, dtype: str) -> float:
    """Rate of an n x n x n matmul in one precision ('fp32' here means TF32 off)."""
    return matmul_rate(n, dtype).tflops


def measure_transfer_gbps(nbytes: int, direction: str, pinned: bool) -> float:
    """Host<->device copy bandwidth for one buffer of `nbytes` ('h2d' or 'd2h')."""
    return gbps(nbytes, measure_sweep([nbytes], direction, pinned)[0].median_ms)


def measure() -> Ceilings:
    """Measure this machine's ceilings now (a few seconds on a GPU)."""
    name, _ = _machine_key()
    quick = current().quick
    if current().is_gpu:
        copy_bytes, n, xfer = (2**28, 4096, 2**26) if quick else (2**31, 8192, 2**30)
        dtypes = list(PRECISIONS)
    else:
        copy_bytes, n, xfer = (2**24, 256, 0) if quick else (2**28, 1024, 0)
        dtypes = ["fp32"]
    c = Ceilings(machine=name, copy_gbps=measure_copy_gbps(copy_bytes),
                 sizes={"copy_bytes": copy_bytes, "matmul": n, "transfer_bytes": xfer})
    for d in dtypes:
        c.matmul_tflops[d] = measure_matmul_tflops(n, d)
    if current().is_gpu:
        for pinned, label in ((True, "pinned"), (False, "pageable")):
            c.h2d_gbps[label] = measure_transfer_gbps(xfer, "h2d", pinned)
            c.d2h_gbps[label] = measure_transfer_gbps(xfer, "d2h", pinned)
        torch.cuda.empty_cache()
    return c


def _cache_path() -> Path:
    return cache_dir() / f"ceilings-{_machine_key()[1]}.json"


def cached() -> Ceilings | None:
    """The ceilings measured before on this machine, or None (never measures)."""
    path = _cache_path()
    try:
        return Ceilings(**json.loads(path.read_text()))
    except (OSError, TypeError, ValueError):
        return None  # none yet, or an older or damaged cache file


def get(refresh: bool = False) -> Ceilings:
    """This machine's ceilings, from the cache when they were measured before."""
    path = _cache_path()
    if not refresh and (c := cached()) is not None:
        return c
    c = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(c), indent=1))
    return c
