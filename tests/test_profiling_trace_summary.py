"""labkit.profiling.trace_summary: busy time, gaps and launches on a trace recorded here (CPU) and on a
hand-built GPU-shaped trace."""
import pytest
from trace_util import gpu_like_trace, record_cpu_trace

from labkit.profiling import chrome_trace as T
from labkit.profiling import trace_summary as S


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    """A real torch.profiler trace of a few small CPU ops, recorded now."""
    return record_cpu_trace(tmp_path_factory.mktemp("trace") / "cpu.json")


def test_cpu_trace_summary_accounts_for_the_window(cpu_trace):
    trace = T.load_trace(cpu_trace)
    s = S.summarize(trace)
    assert s.track == "CPU top-level ops"
    assert s.count >= 16   # 5 x (mm, relu, sum) + exp, at the top level
    assert 0 < s.busy_us <= s.window_us
    assert s.busy_us + sum(s.gaps_us) == pytest.approx(s.window_us, rel=1e-6)
    assert s.launches == 0
    names = [n for n, _, _ in s.top]
    assert any("matmul" in n for n in names) and any("relu" in n for n in names)
    totals = [t for _, _, t in s.top]
    assert totals == sorted(totals, reverse=True)
    assert "CPU top-level ops" in s.table()


def test_within_a_range_counts_only_its_ops(cpu_trace):
    trace = T.load_trace(cpu_trace)
    work = S.summarize(trace, within="work")
    other = S.summarize(trace, within="other")
    assert work.count == 15 and other.count == 1
    assert [n for n, _, _ in other.top] == ["aten::exp"]
    with pytest.raises(KeyError, match="no record_function range 'nope'"):
        S.summarize(trace, within="nope")
    with pytest.raises(ValueError, match="no GPU kernels"):
        S.summarize(trace, track="gpu")
    with pytest.raises(ValueError, match="track must be"):
        S.summarize(trace, track="tpu")


def test_median_of_several_occurrences(cpu_trace):
    trace = T.load_trace(cpu_trace)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("name") != "other"]
    ops = list(T.top_level(T.complete(trace, ("cpu_op",))))
    # three ranges named "step" over thirds of the 15 top-level ops
    for i in range(3):
        part = ops[5 * i:5 * i + 5]
        trace["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "step", "tid": part[0]["tid"],
                                     "ts": part[0]["ts"], "dur": part[-1]["ts"] + part[-1]["dur"] - part[0]["ts"]})
    each = sorted(S.summarize(trace, "step", occurrence=i).busy_fraction for i in range(3))
    assert [S.summarize(trace, "step", occurrence=i).count for i in range(3)] == [5, 5, 5]
    assert S.summarize_median(trace, "step").busy_fraction == each[1]


def test_busy_and_gaps():
    busy, gaps = S.busy_and_gaps([(0, 2), (1, 3), (5, 6), (5.5, 5.7), (10, 11)])
    assert busy == pytest.approx(5.0) and gaps == pytest.approx([2.0, 4.0])
    assert S.busy_and_gaps([]) == (0.0, [])


def test_gpu_track_kernels_gaps_and_launches():
    s = S.summarize(gpu_like_trace(), within="loop")
    assert s.track == "GPU kernels and copies"
    assert s.count == 6 and s.launches == 6
    assert s.busy_us == pytest.approx(12.0)
    assert s.window_us == pytest.approx(5 * 20 + 2)
    assert s.gaps_us == pytest.approx([18.0] * 5)
    assert s.launch_us == pytest.approx(30.0) and s.mean_us == pytest.approx(2.0)
    assert s.median_gap_us == pytest.approx(18.0) and s.idle_us == pytest.approx(90.0)
    assert s.busy_fraction < 0.2
    assert "host launch calls: 6" in s.table()
    everything = S.summarize(gpu_like_trace())   # no range: the stray kernel counts too
    assert everything.count == 7


def test_timeline_rows_start_at_zero():
    tl = S.timeline(gpu_like_trace(), within="loop")
    assert set(tl) == {"CPU ops", "launches", "GPU kernels"}
    assert len(tl["GPU kernels"]) == 6 and min(a for r in tl.values() for a, _ in r) == 0
    assert [d for _, d in tl["GPU kernels"]] == [2.0] * 6
