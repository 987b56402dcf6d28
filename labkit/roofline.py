"""The roofline: the most FLOP/s an operation can reach at its arithmetic intensity.

attainable(I) = min(peak FLOP/s, bandwidth * I), with I = FLOPs / bytes moved. Both ceilings
come from this machine's measurements (`labkit.ceilings.get()`), never from a datasheet.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from labkit.ceilings import FAR_ABOVE, Ceilings
from labkit.figures import fmt_value
from labkit.timing import gbps, tflops

XLABEL = "arithmetic intensity (FLOP/byte)"
YLABEL = "performance (TFLOP/s)"


@dataclass(frozen=True)
class Point:
    """One measured operation: what it must do (FLOPs, bytes) and how long it took."""

    label: str
    flops: float
    nbytes: float
    ms: float

    def __post_init__(self) -> None:
        if not (self.flops > 0 and self.nbytes > 0 and self.ms > 0):
            raise ValueError(f"point {self.label!r}: flops, nbytes and ms must all be > 0 "
                             f"(got {self.flops}, {self.nbytes}, {self.ms})")

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.nbytes

    @property
    def tflops(self) -> float:
        return tflops(self.flops, self.ms)

    @property
    def gbps(self) -> float:
        return gbps(self.nbytes, self.ms)


def _peak(ceil: Ceilings, dtype: str) -> float:
    if dtype not in ceil.matmul_tflops:
        raise KeyError(f"no measured matmul rate for {dtype!r} on {ceil.machine}; "
                       f"measured: {sorted(ceil.matmul_tflops)}")
    return ceil.matmul_tflops[dtype]


def attainable(intensity: float, ceil: Ceilings, dtype: str = "fp32") -> float:
    """The roof at `intensity` FLOP/byte, in TFLOP/s: min(peak, bandwidth * intensity)."""
    if intensity <= 0:
        raise ValueError(f"arithmetic intensity must be > 0 FLOP/byte, got {intensity}")
    return min(_peak(ceil, dtype), ceil.copy_gbps * intensity / 1e3)


def bound(intensity: float, ceil: Ceilings, dtype: str = "fp32") -> str:
    """'memory-bound' left of the ridge point, 'compute-bound' right of it."""
    return "memory-bound" if intensity < ceil.ridge(dtype) else "compute-bound"


def describe(intensity: float, ceil: Ceilings, dtype: str = "fp32") -> str:
    """One sentence: the roof at this intensity and which resource sets it."""
    roof = attainable(intensity, ceil, dtype)
    which = bound(intensity, ceil, dtype)
    limit = (f"bandwidth: {ceil.copy_gbps:,.0f} GB/s x {intensity:.3g} FLOP/byte" if which == "memory-bound"
             else f"the {dtype} matmul rate")
    return (f"At {intensity:.3g} FLOP/byte this machine reaches at most {roof:.3g} TFLOP/s ({dtype}): "
            f"{which}, set by {limit}; ridge at {ceil.ridge(dtype):.3g} FLOP/byte.")


def _x_range(ceil: Ceilings, dtypes: Sequence[str], points: Sequence[Point],
             extra: Iterable[float] = ()) -> tuple[float, float]:
    xs = [ceil.ridge(d) for d in dtypes] + [p.intensity for p in points] + [x for x in extra if x > 0]
    lo, hi = min(xs + [0.1]), max(xs + [10.0])
    return 10 ** math.floor(math.log10(lo) - 0.3), 10 ** math.ceil(math.log10(hi) + 0.3)


def plot(ceil: Ceilings, points: Sequence[Point] = (), dtypes: Sequence[str] | None = None, ax=None,
         title: str | None = None, xlim: tuple[float, float] | None = None):
    """Draw the measured roofline (one roof per dtype) and the measured points; returns the axes."""
    import matplotlib.pyplot as plt

    dtypes = list(dtypes) if dtypes is not None else list(ceil.matmul_tflops)
    if not dtypes:
        raise ValueError(f"{ceil.machine} has no measured matmul rate: nothing to draw the roof from")
    for d in dtypes:
        _peak(ceil, d)
    best = max(dtypes, key=lambda d: _peak(ceil, d))
    above = [p for p in points if p.tflops > FAR_ABOVE * attainable(p.intensity, ceil, best)]
    if above:  # a point far above the roof: the ceilings were measured low (a busy machine)
        ceil.measure_again(f"{above[0].label} at {fmt_value(above[0].tflops)} TFLOP/s, far above this roofline")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    x0, x1 = xlim or _x_range(ceil, dtypes, points)
    top = max(_peak(ceil, d) for d in dtypes)
    ridge_top = top * 1e3 / ceil.copy_gbps
    ax.plot([x0, ridge_top], [ceil.copy_gbps * x0 / 1e3, top], color="black", lw=2,
            label=f"copy bandwidth {fmt_value(ceil.copy_gbps)} GB/s")
    for i, d in enumerate(sorted(dtypes, key=lambda d: -_peak(ceil, d))):
        peak = _peak(ceil, d)
        ax.plot([peak * 1e3 / ceil.copy_gbps, x1], [peak, peak], lw=2, color=f"C{i}",
                label=f"{d} matmul {peak:,.3g} TFLOP/s (ridge {ceil.ridge(d):.3g} FLOP/byte)")
    for p in points:
        ax.scatter([p.intensity], [p.tflops], s=25, zorder=3, color="crimson")
        ax.annotate(p.label, (p.intensity, p.tflops), textcoords="offset points", xytext=(4, -10),
                    fontsize=8)
    ys = [p.tflops for p in points] + [ceil.copy_gbps * x0 / 1e3]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x0, x1)
    ax.set_ylim(min(ys) / 3, max([top] + ys) * 3)  # every point stays on the plot
    ax.set_xlabel(XLABEL)
    ax.set_ylabel(YLABEL)
    ax.set_title(title or f"Roofline of {ceil.machine} (measured ceilings)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return ax


def mark(ax, intensity: float, ceil: Ceilings, dtype: str = "fp32") -> None:
    """Mark one intensity on a roofline plot: a dotted line up to the roof and its value."""
    roof = attainable(intensity, ceil, dtype)
    ax.axvline(intensity, color="gray", ls=":", lw=1)
    ax.scatter([intensity], [roof], marker="D", s=40, color="gray", zorder=4)
    ax.annotate(f"{intensity:.3g} FLOP/B\n<= {roof:.3g} TFLOP/s", (intensity, roof),
                textcoords="offset points", xytext=(5, -24), fontsize=8, color="dimgray")


def static_explorer(ceil: Ceilings, intensities: Sequence[float], points: Sequence[Point] = (),
                    dtype: str = "fp32", show: bool = True):
    """The explorer as one figure for batch runs: several intensities marked on the roof."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot(ceil, points, dtypes=[dtype], ax=ax, xlim=_x_range(ceil, [dtype], points, intensities),
         title=f"Where the roof is, at a few arithmetic intensities ({dtype})")
    for x in intensities:
        mark(ax, x, ceil, dtype)
    if show:
        for x in intensities:
            print(describe(x, ceil, dtype))
    return fig


def explorer(ceil: Ceilings, points: Sequence[Point] = (), dtype: str = "fp32", intensity: float = 1.0):
    """An ipywidgets slider over arithmetic intensity that redraws the roof; None without ipywidgets."""
    try:
        import ipywidgets as widgets
    except ImportError:
        return None
    import matplotlib.pyplot as plt
    from IPython.display import display

    x0, x1 = _x_range(ceil, [dtype], points, [intensity])
    slider = widgets.FloatLogSlider(value=intensity, base=10, min=math.log10(x0), max=math.log10(x1),
                                    step=0.05, description="FLOP/byte", continuous_update=False,
                                    readout_format=".3g")
    text = widgets.Label()
    out = widgets.Output()

    def redraw(change=None) -> None:
        x = slider.value
        text.value = describe(x, ceil, dtype)
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(7, 4.5))
            plot(ceil, points, dtypes=[dtype], ax=ax, xlim=(x0, x1))
            mark(ax, x, ceil, dtype)
            display(fig)
            plt.close(fig)

    slider.observe(redraw, names="value")
    redraw()
    return widgets.VBox([slider, text, out])
