"""labkit.profiling.chrome_trace: loading a trace (and saying what is wrong), picking events, trimming to a range."""
import json

import pytest
from trace_util import gpu_like_trace, record_cpu_trace

from labkit.profiling import chrome_trace as T
from labkit.profiling import trace_summary as S


def test_top_level_drops_nested_events_per_thread():
    evs = [{"ts": 0, "dur": 10, "tid": 1, "name": "outer"}, {"ts": 2, "dur": 3, "tid": 1, "name": "inner"},
           {"ts": 3, "dur": 1, "tid": 2, "name": "other thread"}, {"ts": 12, "dur": 1, "tid": 1, "name": "next"}]
    assert [e["name"] for e in T.top_level(evs)] == ["outer", "other thread", "next"]


def test_launches_and_ranges_are_found():
    trace = gpu_like_trace()
    launches = [e for e in T.complete(trace, T.API_CATS) if T.is_launch(e)]
    assert len(launches) == 6
    assert not T.is_launch({"cat": "cpu_op", "name": "cudaLaunchKernel"})   # a launch is a host API call
    assert T.is_launch({"cat": "cuda_driver", "name": "cuGraphLaunch"})
    assert T.range_of(trace, "loop") == (0.0, 121.0)
    with pytest.raises(KeyError, match="no record_function range 'nope'.*'loop'"):
        T.spans(trace, "nope")


def test_trim_keeps_the_range_and_drops_the_rest(tmp_path):
    small = T.trim(gpu_like_trace(), "loop")
    cats = {e.get("cat") for e in small["traceEvents"]}
    assert "python_function" not in cats and {"kernel", "cuda_runtime", "cpu_op"} <= cats
    assert not any(e.get("name") == "outside" for e in small["traceEvents"])
    assert all(set(e.get("args", {})) <= set(T.KEEP_ARGS) for e in small["traceEvents"] if e.get("ph") == "X")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(small))
    assert S.summarize(T.load_trace(path), within="loop").count == 6
    tl = S.timeline(T.load_trace(path), within="loop")
    assert len(tl["GPU kernels"]) == 6 and len(tl["launches"]) == 6 and min(a for a, _ in tl["CPU ops"]) == 0


def test_load_trace_reads_gzip_and_the_bare_array_form(tmp_path):
    import gzip

    trace = json.loads(record_cpu_trace(tmp_path / "cpu.json").read_text())
    with gzip.open(tmp_path / "cpu.json.gz", "wt") as f:
        json.dump(trace, f)
    (tmp_path / "bare.json").write_text(json.dumps(trace["traceEvents"]))
    for name in ("cpu.json.gz", "bare.json"):
        assert len(T.load_trace(tmp_path / name)["traceEvents"]) == len(trace["traceEvents"])


def test_load_trace_says_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="export_chrome_trace"):
        T.load_trace(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a Chrome trace"):
        T.load_trace(tmp_path / "x.json")


def test_shipped_trace_absent_is_one_line(capsys):
    assert T.shipped_trace(T.ROOT / "reference" / "traces" / "no_such_trace.json") is None
    out = capsys.readouterr().out
    assert out.startswith("No recorded GPU trace shipped yet") and out.count("\n") == 1
