"""This machine's measured ceilings: copy bandwidth, matmul rate, host-device bandwidth.

Measured once per machine (and per quick/full mode) and cached as JSON under
$LABKIT_CACHE (default ~/.cache/labkit), so every notebook states its numbers as a
fraction of what this machine can actually do, not of a datasheet.

Each ceiling is the best of several repeated medians (other work on the machine only slows a
measurement down), checked against what such a device can plausibly do, and stored with when and
under what load it was measured. A notebook that sees a fraction far above 1 measures again.
Refresh by hand with `labkit info --refresh`.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from labkit.device import cache_dir, current, machine_info
from labkit.figures import fmt_value
from labkit.precision import PRECISIONS, matmul_rate
from labkit.timing import bench, gbps, threads
from labkit.transfer import measure_sweep

REPEATS = 3  # medians taken per ceiling; the best one is kept
FAR_ABOVE = 1.5  # a measured fraction of a ceiling beyond this means the ceiling was measured low
# What a working device can plausibly do (device type -> ceiling -> (lowest, highest)): outside it,
# the measurement was disturbed (or broken) and is taken again.
PLAUSIBLE = {
    "cpu": {"copy_gbps": (1.0, 2_000.0), "matmul_tflops": (1e-3, 100.0)},
    "cuda": {"copy_gbps": (50.0, 50_000.0), "matmul_tflops": (0.5, 10_000.0)},
}

@dataclass
class Ceilings:
    """Measured peaks; bandwidths in GB/s, matmul rates in TFLOP/s."""

    machine: str
    copy_gbps: float  # device copy, bytes read + bytes written
    matmul_tflops: dict[str, float] = field(default_factory=dict)  # per dtype name
    h2d_gbps: dict[str, float] = field(default_factory=dict)  # "pinned"/"pageable" -> GB/s
    d2h_gbps: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # problem sizes they were measured at
    measured_at: str = ""  # ISO date and time (UTC)
    load: float | None = None  # 1-minute load average when the measurement started
    cores: int = 0  # CPU cores this process may use
    threads: int = 0  # torch CPU threads used for the measurement
    repeats: dict[str, list[float]] = field(default_factory=dict)  # every repeated median, per ceiling
    warnings: list[str] = field(default_factory=list)  # what looked wrong while measuring

    def copy_fraction(self, achieved_gbps: float) -> float:
        """achieved / copy ceiling; a fraction far above 1 measures the ceilings again first (once)."""
        if achieved_gbps > FAR_ABOVE * self.copy_gbps:
            self.measure_again(f"{fmt_value(achieved_gbps)} GB/s against a copy ceiling of "
                                f"{fmt_value(self.copy_gbps)} GB/s")
        return achieved_gbps / self.copy_gbps

    def matmul_fraction(self, achieved_tflops: float, dtype: str = "fp32") -> float:
        """achieved / matmul ceiling of `dtype`; far above 1 measures the ceilings again first (once)."""
        if achieved_tflops > FAR_ABOVE * self.matmul_tflops[dtype]:
            self.measure_again(f"{fmt_value(achieved_tflops)} TFLOP/s against a {dtype} matmul ceiling of "
                                f"{fmt_value(self.matmul_tflops[dtype])} TFLOP/s")
        return achieved_tflops / self.matmul_tflops[dtype]

    def measure_again(self, what: str) -> None:
        """Measure the ceilings again, once per process, and take the new values (`what` says why)."""
        if getattr(self, "_remeasured", False):
            return
        object.__setattr__(self, "_remeasured", True)
        print(f"ceilings: measured {what} (cached {self.measured_at or 'before'}, load {self.load}): "
              f"the ceilings look low, so they are measured again now.", flush=True)
        fresh = get(refresh=True)
        for k, v in asdict(fresh).items():
            setattr(self, k, v)

    def ridge(self, dtype: str = "fp32") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from bandwidth to compute."""
        return self.matmul_tflops[dtype] * 1e12 / (self.copy_gbps * 1e9)

    def table(self) -> str:
        rows = [("device copy (read + write)", f"{fmt_value(self.copy_gbps)} GB/s")]
        rows += [(f"matmul {k} ({self.sizes.get('matmul')}^3)", f"{fmt_value(v)} TFLOP/s")
                 for k, v in self.matmul_tflops.items()]
        rows += [(f"host->device {k}", f"{fmt_value(v)} GB/s") for k, v in self.h2d_gbps.items()]
        rows += [(f"device->host {k}", f"{fmt_value(v)} GB/s") for k, v in self.d2h_gbps.items()]
        if self.measured_at:
            rows.append(("measured", f"{self.measured_at}, load {self.load} on {self.cores} cores, "
                                     f"{self.threads} threads, best of {REPEATS} medians"))
        rows += [("warning", w) for w in self.warnings]
        rows.append(("refresh", "labkit info --refresh (or labkit.ceilings.get(refresh=True))"))
        width = max(len(r[0]) for r in rows)
        return "\n".join(f"{a:<{width}}  {b}" for a, b in [(f"ceilings of {self.machine}", "")] + rows)


def _machine_key() -> tuple[str, str]:
    info = machine_info()
    name = info["GPU"] if current().is_gpu else f"CPU {info['CPU']} x{info['CPU cores']}"
    facts = ["v2", name, info["torch"], info.get("driver", ""), str(current().quick)]  # v2: robust measurement
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


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity, else os.cpu_count())."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None



def best_of(name: str, measure_once, repeats: int, record: dict[str, list[float]]) -> float:
    """The best of `repeats` medians: load on the machine only ever slows a measurement down."""
    values = [measure_once() for _ in range(repeats)]
    record[name] = [float(f"{v:.6g}") for v in values]
    return max(values)


def implausible(kind: str, c: Ceilings) -> list[str]:
    """The ceilings outside what a working device of this kind can do (empty when all are plausible)."""
    bounds = PLAUSIBLE["cuda" if kind == "cuda" else "cpu"]
    lo, hi = bounds["copy_gbps"]
    found = [] if lo <= c.copy_gbps <= hi else [f"copy {fmt_value(c.copy_gbps)} GB/s (plausible: {lo:g}-{hi:g})"]
    lo, hi = bounds["matmul_tflops"]
    found += [f"matmul {d} {fmt_value(v)} TFLOP/s (plausible: {lo:g}-{hi:g})"
              for d, v in c.matmul_tflops.items() if d in ("fp32", "bf16") and not lo <= v <= hi]
    return found


def _measure_once() -> Ceilings:
    name, _ = _machine_key()
    quick = current().quick
    if current().is_gpu:
        copy_bytes, n, xfer = (2**28, 4096, 2**26) if quick else (2**31, 8192, 2**30)
        dtypes = list(PRECISIONS)
    else:
        copy_bytes, n, xfer = (2**25, 384, 0) if quick else (2**28, 1024, 0)
        dtypes = ["fp32"]
    cores = usable_cores()
    c = Ceilings(machine=name, copy_gbps=0.0, sizes={"copy_bytes": copy_bytes, "matmul": n, "transfer_bytes": xfer},
                 measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 load=load_average(), cores=cores, threads=cores)
    with threads(cores):  # one per usable core, for the measurement
        c.copy_gbps = best_of("copy_gbps", lambda: measure_copy_gbps(copy_bytes), REPEATS, c.repeats)
        for d in dtypes:
            c.matmul_tflops[d] = best_of(f"matmul_tflops.{d}", lambda d=d: measure_matmul_tflops(n, d), REPEATS,
                                         c.repeats)
    if current().is_gpu:
        for pinned, label in ((True, "pinned"), (False, "pageable")):
            c.h2d_gbps[label] = best_of(f"h2d_gbps.{label}", lambda p=pinned: measure_transfer_gbps(xfer, "h2d", p),
                                        REPEATS, c.repeats)
            c.d2h_gbps[label] = best_of(f"d2h_gbps.{label}", lambda p=pinned: measure_transfer_gbps(xfer, "d2h", p),
                                        REPEATS, c.repeats)
        torch.cuda.empty_cache()
    return c


def measure(attempts: int = 3) -> Ceilings:
    """Measure this machine's ceilings now (a few seconds), again while they look implausible."""
    for _ in range(attempts):
        c = _measure_once()
        wrong = implausible(current().device.type, c)
        if not wrong:
            break
    if wrong:
        c.warnings.append(f"implausible after {attempts} attempts: {'; '.join(wrong)}")
    if c.load is not None and c.load > 0.75 * c.cores:
        c.warnings.append(f"measured while the machine was busy (load {c.load} on {c.cores} cores): the ceilings "
                          f"may be low; run `labkit info --refresh` when it is quiet")
    for w in c.warnings:
        print(f"ceilings: {w}", flush=True)
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


def best_of_both(old: Ceilings, new: Ceilings) -> Ceilings:
    """Each ceiling the higher of two measurements of one machine (other work only slows a measurement down, so a
    refresh on a busy machine never lowers a ceiling measured when it was quiet)."""
    merged = Ceilings(**asdict(new))
    merged.copy_gbps = max(old.copy_gbps, new.copy_gbps)
    for name in ("matmul_tflops", "h2d_gbps", "d2h_gbps"):
        old_d, new_d = getattr(old, name), getattr(merged, name)
        for k, v in old_d.items():
            new_d[k] = max(v, new_d.get(k, v))
    return merged


def get(refresh: bool = False) -> Ceilings:
    """This machine's ceilings, from the cache when they were measured before (refresh: measured again, each one
    kept at the higher of the cached and the new value)."""
    path = _cache_path()
    before = cached()
    if not refresh and before is not None:
        return before
    c = measure()
    if before is not None and before.sizes == c.sizes:
        c = best_of_both(before, c)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(c), indent=1))
    return c
