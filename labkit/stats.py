"""The course's statistics, decided once: repeated samples, their spread, and when a timed claim is decided.

- A figure measured more than once is a `Samples` (a `labkit.Timing` is one, in ms; `Timing.map` turns it into
  GB/s, TFLOP/s, ...). Its value is the median; its spread the 20th to 80th percentile range.
- A claim decided by such figures is resampled (the bootstrap): `DRAWS` times, each figure's samples are drawn
  again with replacement and their median taken, and the claim's test is applied to those medians. It is
  decided when at least `AGREE` of the draws give the answer the medians give; in between the spread cannot
  decide it and the verdict is INCONCLUSIVE. The draws are seeded by the claim's name: the same samples give
  the same verdict.
- Samples are kept in the order they were taken, and a shared machine's slow spells last many samples: a
  figure's samples are drawn in runs of consecutive ones (a moving-block bootstrap, `BLOCKS` runs of n / `BLOCKS`
  samples), so a spell is drawn whole or not at all. Drawn one by one, 10,000 samples of which 55% fell in one
  slow spell would look certain to have the slow median; drawn in runs, they show it rests on one spell.
- A sampled figure needs at least `MIN_SAMPLES` samples; with fewer, a claim it decides is INCONCLUSIVE.
- The host is busy when processes other than this one and its children took more than `BUSY_SHARE` of the
  machine's CPU time (Linux's /proc) while a claim's figures were measured: over each `labkit.bench` that timed
  them (carried as `Samples.busy`), and over the whole time since the previous claim; the larger counts, so a
  burst during a short measurement is not diluted by a long quiet cell. A timed claim that does not hold on a
  busy host is INCONCLUSIVE and says so: a loaded machine is noise, not a cause. Samples that count events
  (`counted=True`: kernel launches, syncs) are resampled like the rest, but a claim decided by counts alone is
  not timed: load cannot change a count, so a miss there is a miss.
"""
from __future__ import annotations

import math
import os
import statistics
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import numpy as np

DRAWS = 1000
BLOCKS = 20  # runs of consecutive samples per bootstrap draw: bench_interleaved's rounds
AGREE = 0.95
MIN_SAMPLES = 5
BUSY_SHARE = 0.25


def quantile(xs: Iterable[float], q: float) -> float:
    """The q-quantile of `xs`, interpolated between the two nearest samples."""
    xs = sorted(xs)
    if not xs:
        raise ValueError("no samples")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Samples:
    """Repeated measurements of one quantity, in any unit: the median is its value, p20-p80 its spread."""

    values: tuple[float, ...] = field(repr=False)
    busy: float | None = field(default=None, compare=False)  # others' share of the CPU while measured (None: unknown)
    counted: bool = field(default=False, compare=False)  # counts of events, not clock readings: load cannot move them

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("Samples needs at least one value")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in self.values):
            raise ValueError("Samples takes finite numbers only")

    @classmethod
    def of(cls, values: Iterable[float], busy: float | None = None, counted: bool = False) -> "Samples":
        return cls(tuple(float(v.item() if hasattr(v, "item") else v) for v in values), busy, counted)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def p20(self) -> float:
        return quantile(self.values, 0.2)

    @property
    def p80(self) -> float:
        return quantile(self.values, 0.8)

    @property
    def spread(self) -> float:
        """(p80 - p20) / |median|: 0.05 means the middle 60% of samples lie within 5%."""
        m = abs(self.median)
        return (self.p80 - self.p20) / m if m > 0 else 0.0

    def map(self, f: Callable[[float], float]) -> "Samples":
        """The same samples in another unit, e.g. `t.map(lambda ms: labkit.gbps(nbytes, ms))`."""
        return Samples.of((f(v) for v in self.values), self.busy, self.counted)


@dataclass(frozen=True)
class Decision:
    """A test applied to figures that may carry samples: the answer at the medians and how firm it is."""

    at_medians: bool
    agree: float | None  # share of bootstrap draws that give the same answer (None: no sampled figure)
    too_few: tuple[str, ...] = ()  # sampled figures with fewer than MIN_SAMPLES samples

    @property
    def decided(self) -> bool:
        return not self.too_few and (self.agree is None or self.agree >= AGREE)


def decide(test: Callable[[Mapping[str, object]], object], values: Mapping[str, object],
           samples: Mapping[str, Samples], seed: str, invert: bool = False) -> Decision:
    """Apply `test` to the medians, then to `DRAWS` bootstrap medians of the sampled figures."""
    def run(v: Mapping[str, object]) -> bool:
        out = test(v)
        out = bool(out.item()) if hasattr(out, "item") else out
        if not isinstance(out, bool):
            raise TypeError(f"a claim's test must return True or False, not {type(out).__name__}")
        return out != invert

    first = run(values)
    if not samples:
        return Decision(first, None)
    too_few = tuple(k for k, s in samples.items() if s.n < MIN_SAMPLES)
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    drawn = {k: np.median(block_draws(np.asarray(s.values), rng), axis=1) for k, s in samples.items()}
    same = sum(run({**values, **{k: float(d[i]) for k, d in drawn.items()}}) == first for i in range(DRAWS))
    return Decision(first, same / DRAWS, too_few)


def block_draws(values: np.ndarray, rng: np.random.Generator, draws: int = DRAWS) -> np.ndarray:
    """`draws` resamples of `values` (in the order taken), each `BLOCKS` runs of n / `BLOCKS` consecutive samples
    from random starts (wrapping at the end), cut to n: shape (draws, n). Twenty samples or fewer: one by one."""
    n = len(values)
    run = -(-n // BLOCKS)
    starts = rng.integers(0, n, size=(draws, -(-n // run)))
    index = (starts[:, :, None] + np.arange(run)) % n
    return values[index.reshape(draws, -1)[:, :n]]


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


def _machine_busy_ticks() -> int | None:
    """Ticks every CPU of the machine spent busy since boot (all processes), or None without /proc."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
    except OSError:
        return None
    ticks = [int(x) for x in parts[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4]


def _own_ticks() -> int:
    """Ticks used by this process (all its threads), its reaped children, and its living descendants."""
    from labkit import proctree

    me = os.getpid()
    total = 0
    for pid in [me, *proctree.below(me)]:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2:].split()
        used = int(fields[11]) + int(fields[12])  # utime stime
        if pid == me:
            used += int(fields[13]) + int(fields[14])  # cutime cstime: children already waited for
        total += used
    return total


class HostLoad:
    """How much of the machine's CPU other processes used between two readings (Linux; None elsewhere)."""

    def __init__(self) -> None:
        self.wall, self.machine, self.own = self._read()
        self.last: float | None = None

    @staticmethod
    def _read() -> tuple[float, int | None, int]:
        return time.monotonic(), _machine_busy_ticks(), _own_ticks()

    def others_share(self) -> float | None:
        """Share of all CPUs' time since the last reading used by other processes; starts a new reading. Under
        0.05 s after the last reading is too short to read: the last share stands and that reading goes on."""
        wall, machine, own = self._read()
        if self.machine is None or machine is None:
            return None
        if wall - self.wall <= 0.05:
            return self.last
        capacity = (wall - self.wall) * _clock_ticks() * (os.cpu_count() or 1)
        self.last = max(0.0, ((machine - self.machine) - (own - self.own)) / capacity)
        self.wall, self.machine, self.own = wall, machine, own
        return self.last
