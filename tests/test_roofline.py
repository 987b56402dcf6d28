"""The roofline helper: the roof's arithmetic, the plot's axes and lines, and the explorer."""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from labkit import roofline  # noqa: E402
from labkit.ceilings import Ceilings  # noqa: E402

# A made-up machine: 1000 GB/s and two roofs, so ridges are 50 and 500 FLOP/byte.
CEIL = Ceilings(machine="test machine", copy_gbps=1000.0, matmul_tflops={"fp32": 50.0, "bf16": 500.0})


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_attainable_is_min_of_bandwidth_and_peak():
    assert roofline.attainable(1.0, CEIL) == pytest.approx(1.0)  # 1000 GB/s * 1 FLOP/B = 1 TFLOP/s
    assert roofline.attainable(10.0, CEIL) == pytest.approx(10.0)
    assert roofline.attainable(50.0, CEIL) == pytest.approx(50.0)  # the ridge: both limits meet
    assert roofline.attainable(1e4, CEIL) == pytest.approx(50.0)
    assert roofline.attainable(1e4, CEIL, "bf16") == pytest.approx(500.0)
    assert roofline.attainable(100.0, CEIL, "bf16") == pytest.approx(100.0)


def test_bound_switches_at_the_ridge():
    assert roofline.bound(49.0, CEIL) == "memory-bound"
    assert roofline.bound(51.0, CEIL) == "compute-bound"
    assert roofline.bound(100.0, CEIL, "bf16") == "memory-bound"


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(ValueError, match="> 0"):
        roofline.attainable(0.0, CEIL)
    with pytest.raises(KeyError, match="fp16"):
        roofline.attainable(1.0, CEIL, "fp16")
    with pytest.raises(ValueError, match="must all be > 0"):
        roofline.Point("empty", flops=0, nbytes=8, ms=1.0)


def test_point_counts():
    p = roofline.Point("add", flops=1e6, nbytes=12e6, ms=0.5)
    assert p.intensity == pytest.approx(1 / 12)
    assert p.tflops == pytest.approx(1e6 / 0.5e-3 / 1e12)
    assert p.gbps == pytest.approx(12e6 / 0.5e-3 / 1e9)


def test_describe_names_the_limit():
    low = roofline.describe(2.0, CEIL)
    assert "memory-bound" in low and "2 TFLOP/s" in low
    high = roofline.describe(1000.0, CEIL)
    assert "compute-bound" in high and "50 TFLOP/s" in high


def test_plot_draws_measured_roofs_and_points_on_log_axes():
    pts = [roofline.Point("a", 1e9, 1e9, 1.0), roofline.Point("b", 1e12, 1e9, 100.0)]
    ax = roofline.plot(CEIL, pts)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "FLOP/byte" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel()
    assert ax.get_title()
    lines = ax.get_lines()
    # the bandwidth slope: y = copy_gbps * x / 1e3 at both ends
    slope = lines[0]
    for x, y in zip(slope.get_xdata(), slope.get_ydata()):
        assert y == pytest.approx(CEIL.copy_gbps * x / 1e3)
    roofs = sorted(line.get_ydata()[0] for line in lines[1:])
    assert roofs == pytest.approx([50.0, 500.0])
    # each roof starts at its ridge
    for line in lines[1:]:
        assert line.get_xdata()[0] == pytest.approx(line.get_ydata()[0] * 1e3 / CEIL.copy_gbps)
    offsets = [o for c in ax.collections for o in c.get_offsets()]
    assert [v for o in offsets for v in o] == pytest.approx([v for p in pts for v in (p.intensity, p.tflops)])
    labels = ax.get_legend_handles_labels()[1]
    assert any("GB/s" in s for s in labels)
    texts = [t.get_text() for t in ax.texts]
    assert any("fp32" in t and "50 TFLOP/s" in t for t in texts) and any("bf16" in t and "500" in t for t in texts)
    assert {"a", "b"} <= set(texts)  # every point is labelled
    x0, x1 = ax.get_xlim()
    assert x0 < min(p.intensity for p in pts) and x1 > 500.0


def test_plot_one_dtype_and_unknown_dtype():
    ax = roofline.plot(CEIL, dtypes=["fp32"])
    assert [line.get_ydata()[0] for line in ax.get_lines()[1:]] == pytest.approx([50.0])
    with pytest.raises(KeyError, match="tf32"):
        roofline.plot(CEIL, dtypes=["tf32"])


def test_static_explorer_marks_each_intensity(capsys):
    fig = roofline.static_explorer(CEIL, [0.5, 50.0, 2000.0])
    ax = fig.axes[0]
    marks = [v for c in ax.collections[-3:] for v in c.get_offsets()[0]]
    assert marks == pytest.approx([0.5, 0.5, 50.0, 50.0, 2000.0, 50.0])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "memory-bound" in out[0] and "compute-bound" in out[2]
    assert ax.get_xlim()[1] > 2000.0


def test_explorer_slider_updates_the_text():
    pytest.importorskip("ipywidgets")
    box = roofline.explorer(CEIL, dtype="fp32", intensity=1.0)
    slider, label, _ = box.children
    assert "memory-bound" in label.value
    slider.value = 1000.0
    assert "compute-bound" in label.value
    assert math.isclose(10 ** slider.max, roofline._x_range(CEIL, ["fp32"], [], [1.0])[1])


def _overlaps(ax):
    fig = ax.figure
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, r) for t in ax.texts]  # the text alone, not its leader line
    return [(ax.texts[i].get_text(), ax.texts[j].get_text()) for i in range(len(boxes))
            for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]


def test_close_roofs_share_a_line_and_extra_roofs_are_dashed():
    ceil = Ceilings(machine="m", copy_gbps=1000.0, matmul_tflops={"fp32": 50.0, "fp16": 490.0, "bf16": 500.0})
    ax = roofline.plot(ceil, extra_roofs={"fp32 FMA on CUDA cores": 60.0})
    roofs = ax.get_lines()[1:]
    assert sorted(line.get_ydata()[0] for line in roofs) == pytest.approx([50.0, 60.0, 500.0])  # fp16 joins bf16
    assert [line.get_linestyle() for line in roofs if line.get_ydata()[0] == 60.0] == ["--"]
    texts = [t.get_text() for t in ax.texts]
    assert any("bf16" in t and "fp16" in t for t in texts) and any("model" in t for t in texts)
    assert roofline.roof_groups({"a": 100.0, "b": 95.0, "c": 50.0}) == [(100.0, ["a", "b"]), (50.0, ["c"])]
    with pytest.raises(ValueError, match="extra roof"):
        roofline.plot(ceil, extra_roofs={"broken": 0.0})


def test_labels_of_crowded_points_and_close_roofs_do_not_overlap():
    ceil = Ceilings(machine="m", copy_gbps=4000.0,
                    matmul_tflops={"fp32": 51.0, "tf32": 360.0, "fp16": 680.0, "bf16": 690.0})
    pts = [roofline.Point(f"matmul {n}", 2 * n**3, 6 * n * n, 2 * n**3 / (600e9 * (0.9 + n % 7 / 30)))
           for n in (1024, 1100, 1200, 1300, 2048, 4096, 8191, 8192)]
    pts += [roofline.Point(f"k={k}", k * 1e8, 8e8, max(0.2, 0.2 * k / 60)) for k in (1, 2, 4, 8, 16, 32, 64)]
    ax = roofline.plot(ceil, pts, extra_roofs={"fp32 FMA": 66.0, "fp32 multiply": 33.0})
    assert len(ax.texts) == len(pts) + 5  # 5 roof lines: bf16/fp16 together, tf32, FMA, fp32, multiply
    assert _overlaps(ax) == []
    fig = roofline.static_explorer(ceil, [0.1, 172.0, 1000.0], points=pts, dtype="bf16", show=False)
    assert _overlaps(fig.axes[0]) == []


def test_a_point_far_above_the_roof_measures_again_and_stays_on_the_plot(monkeypatch, capsys):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit import ceilings

    stale = ceilings.Ceilings(machine="busy", copy_gbps=4.0, matmul_tflops={"fp32": 0.001})
    fresh = ceilings.Ceilings(machine="busy", copy_gbps=40.0, matmul_tflops={"fp32": 0.2})
    calls = []
    monkeypatch.setattr(ceilings, "get", lambda refresh=False: calls.append(refresh) or fresh)
    fast = roofline.Point("matmul", flops=2e9, nbytes=1e7, ms=20.0)  # 0.1 TFLOP/s: 100x the stale roof
    ax = roofline.plot(stale, [fast])
    assert calls == [True] and stale.matmul_tflops["fp32"] == 0.2  # the ceilings were measured again
    assert ax.get_ylim()[1] > fast.tflops  # and the point is inside the plot
    assert "measured again" in capsys.readouterr().out
    plt.close(ax.figure)
