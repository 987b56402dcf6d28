"""The roofline: the most FLOP/s an operation can reach at its arithmetic intensity.

attainable(I) = min(peak FLOP/s, bandwidth * I), with I = FLOPs / bytes moved. Both ceilings
come from this machine's measurements (`labkit.ceilings.get()`), never from a datasheet.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

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


def roof_groups(roofs: Mapping[str, float], within: float = 0.1) -> list[tuple[float, list[str]]]:
    """Roofs closer than `within` (relative) share one line, so none hides another: [(peak, [names])]."""
    groups: list[tuple[float, list[str]]] = []
    for name, peak in sorted(roofs.items(), key=lambda kv: -kv[1]):
        if groups and groups[-1][0] <= peak * (1 + within):
            groups[-1][1].append(name)
        else:
            groups.append((peak, [name]))
    return groups


class _Labels:
    """Places text boxes on an axes so that they overlap neither each other nor the marked points."""

    def __init__(self, ax, fontsize: float = 8) -> None:
        self.ax, self.fontsize = ax, fontsize
        self.scale = ax.figure.dpi / 72  # pixels per point
        self.boxes: list[tuple[float, float, float, float]] = []

    def size(self, text: str) -> tuple[float, float]:
        lines = text.splitlines() or [""]
        return 0.62 * self.fontsize * max(len(s) for s in lines) + 2, 1.3 * self.fontsize * len(lines) + 1

    def block(self, x: float, y: float, radius: float = 4.0) -> None:
        """Keep labels off a marker at data point (x, y)."""
        px, py = self.ax.transData.transform((x, y))
        r = radius * self.scale
        self.boxes.append((px - r, py - r, px + r, py + r))

    def _free(self, box) -> float:
        """Overlap (pixels squared) with placed boxes, plus a penalty for leaving the axes."""
        x0, y0, x1, y1 = box
        ax0, ay0, ax1, ay1 = self.ax.bbox.extents
        out = 1e6 if (x0 < ax0 or y0 < ay0 or x1 > ax1 or y1 > ay1) else 0.0
        return out + sum(max(0.0, min(x1, b[2]) - max(x0, b[0])) * max(0.0, min(y1, b[3]) - max(y0, b[1]))
                         for b in self.boxes)

    def place(self, text: str, x: float, y: float, offsets: Sequence[tuple[float, float]], **kw) -> None:
        """Write `text` at the first offset (points, lower-left corner) where it overlaps nothing."""
        w, h = self.size(text)
        px, py = self.ax.transData.transform((x, y))
        best = None
        for dx, dy in offsets:
            box = (px + dx * self.scale, py + dy * self.scale, px + (dx + w) * self.scale, py + (dy + h) * self.scale)
            cost = self._free(box)
            if best is None or cost < best[0]:
                best = (cost, dx, dy, box)
            if cost == 0:
                break
        cost, dx, dy, box = best
        self.boxes.append(box)
        far = max(dx, -dx - w, dy, -dy - h) > 10
        arrow = dict(arrowstyle="-", color="gray", lw=0.5) if far else None
        self.ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=self.fontsize,
                         ha="left", va="bottom", arrowprops=arrow, **kw)

    def block_line(self, xs: Sequence[float], ys: Sequence[float], step_px: float = 5.0) -> None:
        """Keep labels off a straight line (in display space) through the data points xs, ys."""
        pts = [self.ax.transData.transform((x, y)) for x, y in zip(xs, ys)]
        r = 1.5 * self.scale
        for (ax_, ay), (bx, by) in zip(pts, pts[1:]):
            n = max(1, int(math.hypot(bx - ax_, by - ay) / step_px))
            self.boxes += [(ax_ + (bx - ax_) * i / n - r, ay + (by - ay) * i / n - r,
                            ax_ + (bx - ax_) * i / n + r, ay + (by - ay) * i / n + r) for i in range(n + 1)]

    def near_point(self, text: str, x: float, y: float, **kw) -> None:
        """A point's label beside it, or further out with a thin leader line when the space is taken."""
        w, h = self.size(text)
        offsets = []
        for d in (3, 12, 22, 34, 48, 64):
            offsets += [(d, 1), (d, -h - 1), (-w - d, 1), (-w - d, -h - 1), (-w / 2, d), (-w / 2, -h - d)]
        self.place(text, x, y, offsets, **kw)

    def in_margin(self, entries: Sequence[tuple[str, float, str]]) -> None:
        """Roof names in the right margin, each level with its roof, pushed apart so none overlap."""
        import matplotlib.transforms as mtransforms

        blend = mtransforms.blended_transform_factory(self.ax.transAxes, self.ax.transData)
        placed_top = math.inf
        for text, y, color in sorted(entries, key=lambda e: -e[1]):
            w, h = self.size(text)
            py = self.ax.transData.transform((1.0, y))[1] / self.scale  # in points
            mid = min(py, placed_top - h / 2)  # centre of the label, below the previous one
            placed_top = mid - h / 2 - 2
            self.ax.annotate(text, (1.0, y), xycoords=blend, xytext=(6, mid - py), textcoords="offset points",
                             fontsize=self.fontsize, ha="left", va="center", color=color, annotation_clip=False)


def _labels(ax) -> _Labels:
    if not hasattr(ax, "_labkit_labels"):
        ax._labkit_labels = _Labels(ax)
    return ax._labkit_labels


def plot(ceil: Ceilings, points: Sequence[Point] = (), dtypes: Sequence[str] | None = None, ax=None,
         title: str | None = None, xlim: tuple[float, float] | None = None,
         extra_roofs: Mapping[str, float] | None = None):
    """Draw the measured roofline (one roof per dtype) and the measured points; returns the axes.

    extra_roofs: more flat roofs in TFLOP/s, drawn dashed, e.g. {"fp32 FMA on CUDA cores": 67.0}
    (a ceiling counted from hardware constants rather than measured). Roofs within 10% of each
    other share one line; every label is placed where it overlaps no other label or point.
    """
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
    extra = dict(extra_roofs or {})
    for name, peak in extra.items():
        if not peak > 0:
            raise ValueError(f"extra roof {name!r} must be > 0 TFLOP/s, got {peak}")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5))
    measured = {f"{d} matmul": _peak(ceil, d) for d in dtypes}
    x0, x1 = xlim or _x_range(ceil, dtypes, points, [p * 1e3 / ceil.copy_gbps for p in extra.values()])
    top = max(list(measured.values()) + list(extra.values()))
    ys = [p.tflops for p in points] + [ceil.copy_gbps * x0 / 1e3]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x0, x1)
    ax.set_ylim(min(ys) / 3, max([top] + ys) * 3)  # every point stays on the plot
    ax.plot([x0, top * 1e3 / ceil.copy_gbps], [ceil.copy_gbps * x0 / 1e3, top], color="black", lw=2,
            label=f"copy bandwidth {ceil.copy_gbps:,.0f} GB/s (measured)")
    roofs = [(peak, names, all(n in measured for n in names))
             for peak, names in roof_groups({**measured, **extra})]
    labels = _labels(ax)
    for p in points:
        labels.block(p.intensity, p.tflops)
    labels.block_line([x0, top * 1e3 / ceil.copy_gbps], [ceil.copy_gbps * x0 / 1e3, top])
    every = {**measured, **extra}
    margin = []
    for i, (peak, names, is_measured) in enumerate(roofs):
        ridge = peak * 1e3 / ceil.copy_gbps
        ax.plot([ridge, x1], [peak, peak], lw=2 if is_measured else 1.5, color=f"C{i}",
                ls="-" if is_measured else "--")
        labels.block_line([ridge, x1], [peak, peak])
        margin.append((" / ".join(names) + "\n" + " / ".join(f"{every[n]:,.3g}" for n in names)
                       + f" TFLOP/s{'' if is_measured else ' (model)'}", peak, f"C{i}"))
    labels.in_margin(margin)
    if points:
        ax.scatter([p.intensity for p in points], [p.tflops for p in points], s=25, zorder=3, color="crimson",
                   label="measured operations")
    for p in sorted(points, key=lambda p: (p.intensity, -p.tflops)):
        labels.near_point(p.label, p.intensity, p.tflops)
    ax.set_xlabel(XLABEL)
    ax.set_ylabel(YLABEL)
    ax.set_title(title or f"Roofline of {ceil.machine} (measured ceilings)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return ax


def mark(ax, intensity: float, ceil: Ceilings, dtype: str = "fp32") -> None:
    """Mark one intensity on a roofline plot: a dotted line up to the roof and its value."""
    roof = attainable(intensity, ceil, dtype)
    ax.axvline(intensity, color="gray", ls=":", lw=1)
    ax.scatter([intensity], [roof], marker="D", s=40, color="gray", zorder=4)
    labels = _labels(ax)
    labels.block(intensity, roof)
    labels.near_point(f"{intensity:.3g} FLOP/B\n<= {roof:.3g} TFLOP/s", intensity, roof, color="dimgray")


def static_explorer(ceil: Ceilings, intensities: Sequence[float], points: Sequence[Point] = (),
                    dtype: str = "fp32", show: bool = True):
    """The explorer as one figure for batch runs: several intensities marked on the roof."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
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
            fig, ax = plt.subplots(figsize=(8, 5))
            plot(ceil, points, dtypes=[dtype], ax=ax, xlim=(x0, x1))
            mark(ax, x, ceil, dtype)
            display(fig)
            plt.close(fig)

    slider.observe(redraw, names="value")
    redraw()
    return widgets.VBox([slider, text, out])
