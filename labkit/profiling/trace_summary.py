"""Where a trace's time went: busy time and idle gaps of the GPU's kernels (or the CPU's top-level
ops), the host's launch calls, the top events, and a per-row timeline for plotting.

Used by: notebook 11 (through labkit.profiling).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from labkit.profiling.chrome_trace import API_CATS, DEVICE_CATS, complete, is_launch, range_of, spans, top_level


def busy_and_gaps(intervals: Iterable[tuple[float, float]]) -> tuple[float, list[float]]:
    """Union length of [start, end] intervals and the idle gaps between them (same unit)."""
    busy, gaps, end = 0.0, [], None
    for a, b in sorted(intervals):
        if end is None:
            busy, end = b - a, b
        elif a > end:
            gaps.append(a - end)
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    return busy, gaps


@dataclass
class TraceSummary:
    """Where the time went on one track (GPU kernels, or the CPU's top-level ops); times in us."""

    track: str
    window_us: float
    busy_us: float
    gaps_us: list[float] = field(repr=False)
    count: int
    launches: int = 0
    launch_us: float = 0.0
    top: list[tuple[str, int, float]] = field(default_factory=list)  # (name, calls, total us)

    @property
    def idle_us(self) -> float:
        return self.window_us - self.busy_us

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.window_us if self.window_us > 0 else 0.0

    @property
    def mean_us(self) -> float:
        """Mean duration of one event on the track (a kernel, or a top-level op)."""
        total = sum(t for _, _, t in self.top)
        return total / self.count if self.count else 0.0

    @property
    def median_gap_us(self) -> float:
        g = sorted(self.gaps_us)
        return g[len(g) // 2] if g else 0.0

    def table(self, rows: int = 8) -> str:
        """The summary and the top events by total time, as text."""
        lines = [f"{self.track}: {self.count} events in a {self.window_us:,.1f} us window; busy "
                 f"{self.busy_us:,.1f} us ({self.busy_fraction:.0%}), idle {self.idle_us:,.1f} us in "
                 f"{len(self.gaps_us)} gaps (median gap {self.median_gap_us:.2f} us)"]
        if self.launches:
            lines.append(f"host launch calls: {self.launches}, {self.launch_us:,.1f} us in total "
                         f"({self.launch_us / self.launches:.2f} us each) vs {self.mean_us:.2f} us per kernel")
        width = min(60, max([len(n) for n, _, _ in self.top[:rows]] + [4]))
        lines.append(f"  {'name':<{width}}  {'calls':>6}  {'total us':>10}  {'mean us':>8}")
        for name, n, total in self.top[:rows]:
            short = name if len(name) <= width else name[:width - 3] + "..."
            lines.append(f"  {short:<{width}}  {n:>6}  {total:>10,.1f}  {total / n:>8.2f}")
        return "\n".join(lines)


def _runtime(trace: dict[str, Any], lo: float, hi: float) -> tuple[list[dict], list[dict]]:
    """The runtime (API) calls between lo and hi, and those of them that launch a kernel."""
    api = [e for e in complete(trace, API_CATS) if lo <= float(e["ts"]) <= hi]
    return api, [e for e in api if is_launch(e)]


def summarize(trace: dict[str, Any], within: str | None = None, track: str = "auto",
              occurrence: int = -1) -> TraceSummary:
    """Busy time, idle gaps, launches and top events of a trace's device track.

    track: "gpu" (kernels, memcpys, memsets), "cpu" (top-level CPU ops: the gaps between them are
    Python and framework time), or "auto" (the GPU when the trace has kernels). `within` names a
    record_function range (its last occurrence, or the `occurrence`-th): only work launched inside
    it counts.
    """
    device = complete(trace, DEVICE_CATS)
    if track == "auto":
        track = "gpu" if device else "cpu"
    if track not in ("gpu", "cpu"):
        raise ValueError(f"track must be 'gpu', 'cpu' or 'auto', not {track!r}")
    lo, hi = range_of(trace, within, occurrence) if within else (float("-inf"), float("inf"))
    api, launches = _runtime(trace, lo, hi)
    if track == "gpu":
        if not device:
            raise ValueError("this trace holds no GPU kernels (recorded without ProfilerActivity.CUDA, or on a CPU)")
        if within:
            ids = {e.get("args", {}).get("correlation") for e in api}  # launches and the runtime calls around them
            events = [e for e in device if e.get("args", {}).get("correlation") in ids]
        else:
            events = device
        label = "GPU kernels and copies"
    else:
        ops = [e for e in complete(trace, ("cpu_op",))
               if lo <= float(e["ts"]) and float(e["ts"]) + float(e["dur"]) <= hi]
        events = top_level(ops)
        label = "CPU top-level ops"
    if not events:
        raise ValueError(f"no {label} found" + (f" inside range {within!r}" if within else ""))
    ivs = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events]
    busy, gaps = busy_and_gaps(ivs)
    window = max(b for _, b in ivs) - min(a for a, _ in ivs)
    totals: dict[str, list[float]] = {}
    for e in events:
        totals.setdefault(e["name"], []).append(float(e["dur"]))
    top = sorted(((n, len(d), sum(d)) for n, d in totals.items()), key=lambda r: -r[2])
    return TraceSummary(label, window, busy, gaps, len(events), len(launches),
                        sum(float(e["dur"]) for e in launches), top)


def summarize_median(trace: dict[str, Any], within: str, track: str = "auto") -> TraceSummary:
    """Summarise every occurrence of range `within` and return the one with the median busy share
    (one profiled step can be disturbed by the OS; the middle of several is the typical one)."""
    each = sorted((summarize(trace, within, track, i) for i in range(len(spans(trace, within)))),
                  key=lambda s: s.busy_fraction)
    return each[len(each) // 2]


def timeline(trace: dict[str, Any], within: str | None = None) -> dict[str, list[tuple[float, float]]]:
    """(start, duration) in us from the first event, per row: 'CPU ops', 'launches', 'GPU kernels'."""
    lo, hi = range_of(trace, within) if within else (float("-inf"), float("inf"))
    cpu = [e for e in top_level(complete(trace, ("cpu_op",))) if lo <= float(e["ts"]) <= hi]
    _, launches = _runtime(trace, lo, hi)
    ids = {e.get("args", {}).get("correlation") for e in launches}
    kernels = [e for e in complete(trace, DEVICE_CATS) if not within or e.get("args", {}).get("correlation") in ids]
    rows = {"CPU ops": cpu, "launches": launches, "GPU kernels": kernels}
    t0 = min([float(e["ts"]) for r in rows.values() for e in r] or [0.0])
    return {k: [(float(e["ts"]) - t0, float(e["dur"])) for e in r] for k, r in rows.items()}
