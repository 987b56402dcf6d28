"""labkit.profiling: trace summaries on a trace recorded here (CPU) and on a hand-built GPU-shaped
trace, trimming, and the ncu CSV parser on committed reports."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from labkit import profiling as P

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
# Format fixtures: hand-written to follow ncu's documented CSV layouts; plausible, not measured numbers.
RAW_FIXTURE = DATA / "ncu_raw_format_fixture.csv"
DETAILS_FIXTURE = DATA / "ncu_details_format_fixture.csv"


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    """A real torch.profiler trace of a few small CPU ops, recorded now."""
    path = tmp_path_factory.mktemp("trace") / "cpu.json"
    x = torch.randn(37, 53)
    w = torch.randn(53, 29)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("work"):
            for _ in range(5):
                y = torch.relu(x @ w)
                y = y.sum(dim=0)
        with record_function("other"):
            torch.exp(x)
    prof.export_chrome_trace(str(path))
    return path


def test_cpu_trace_summary_accounts_for_the_window(cpu_trace):
    trace = P.load_trace(cpu_trace)
    s = P.summarize(trace)
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
    trace = P.load_trace(cpu_trace)
    work = P.summarize(trace, within="work")
    other = P.summarize(trace, within="other")
    assert work.count == 15 and other.count == 1
    assert [n for n, _, _ in other.top] == ["aten::exp"]
    with pytest.raises(KeyError, match="no record_function range 'nope'"):
        P.summarize(trace, within="nope")
    with pytest.raises(ValueError, match="no GPU kernels"):
        P.summarize(trace, track="gpu")


def test_median_of_several_occurrences(cpu_trace):
    trace = P.load_trace(cpu_trace)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("name") != "other"]
    ops = [e for e in P.top_level(P._complete(trace, ("cpu_op",)))]
    # three ranges named "step" over thirds of the 15 top-level ops
    for i in range(3):
        part = ops[5 * i:5 * i + 5]
        trace["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "step", "tid": part[0]["tid"],
                                     "ts": part[0]["ts"], "dur": part[-1]["ts"] + part[-1]["dur"] - part[0]["ts"]})
    each = sorted(P.summarize(trace, "step", occurrence=i).busy_fraction for i in range(3))
    assert [P.summarize(trace, "step", occurrence=i).count for i in range(3)] == [5, 5, 5]
    assert P.summarize_median(trace, "step").busy_fraction == each[1]


def test_busy_and_gaps_and_top_level():
    busy, gaps = P.busy_and_gaps([(0, 2), (1, 3), (5, 6), (5.5, 5.7), (10, 11)])
    assert busy == pytest.approx(5.0) and gaps == pytest.approx([2.0, 4.0])
    evs = [{"ts": 0, "dur": 10, "tid": 1, "name": "outer"}, {"ts": 2, "dur": 3, "tid": 1, "name": "inner"},
           {"ts": 3, "dur": 1, "tid": 2, "name": "other thread"}, {"ts": 12, "dur": 1, "tid": 1, "name": "next"}]
    assert [e["name"] for e in P.top_level(evs)] == ["outer", "other thread", "next"]


def _gpu_like_trace(n=6, launch=5.0, kernel=2.0, gap=20.0):
    """A trace shaped as torch.profiler writes a CUDA run: launches on the host, kernels on the device,
    linked by 'correlation'; each kernel starts 1 us after its launch ends."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "loop", "ts": 0.0, "dur": n * gap + 1, "tid": 1, "pid": 1}]
    for i in range(n):
        t = i * gap
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": t, "dur": launch + 2, "tid": 1, "pid": 1,
                   "args": {"External id": i}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 1, "dur": launch, "tid": 1,
                   "pid": 1, "args": {"correlation": 100 + i}})
        ev.append({"ph": "X", "cat": "kernel", "name": "gemm_small", "ts": t + 2 + launch, "dur": kernel, "tid": 7,
                   "pid": 0, "args": {"correlation": 100 + i, "grid": [1, 1, 1], "Python id": 3}})
        ev.append({"ph": "X", "cat": "python_function", "name": "loop.py(3): step", "ts": t, "dur": 9, "tid": 1, "pid": 1})
    ev.append({"ph": "X", "cat": "kernel", "name": "outside", "ts": 1e4, "dur": 1, "tid": 7, "pid": 0,
               "args": {"correlation": 999}})
    ev.append({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}})
    return {"schemaVersion": 1, "traceEvents": ev}


def test_gpu_track_kernels_gaps_and_launches():
    s = P.summarize(_gpu_like_trace(), within="loop")
    assert s.track == "GPU kernels and copies"
    assert s.count == 6 and s.launches == 6
    assert s.busy_us == pytest.approx(12.0)
    assert s.window_us == pytest.approx(5 * 20 + 2)
    assert s.gaps_us == pytest.approx([18.0] * 5)
    assert s.launch_us == pytest.approx(30.0) and s.mean_us == pytest.approx(2.0)
    assert s.busy_fraction < 0.2
    everything = P.summarize(_gpu_like_trace())   # no range: the stray kernel counts too
    assert everything.count == 7


def test_trim_keeps_the_range_and_drops_the_rest(tmp_path):
    small = P.trim(_gpu_like_trace(), "loop")
    cats = {e.get("cat") for e in small["traceEvents"]}
    assert "python_function" not in cats and {"kernel", "cuda_runtime", "cpu_op"} <= cats
    assert not any(e.get("name") == "outside" for e in small["traceEvents"])
    assert all(set(e.get("args", {})) <= set(P.KEEP_ARGS) for e in small["traceEvents"] if e.get("ph") == "X")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(small))
    assert P.summarize(P.load_trace(path), within="loop").count == 6
    tl = P.timeline(P.load_trace(path), within="loop")
    assert len(tl["GPU kernels"]) == 6 and len(tl["launches"]) == 6 and min(a for a, _ in tl["CPU ops"]) == 0


def test_load_trace_says_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="export_chrome_trace"):
        P.load_trace(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a Chrome trace"):
        P.load_trace(tmp_path / "x.json")


def test_shipped_trace_absent_is_one_line(tmp_path, capsys):
    assert P.shipped_trace(P.ROOT / "reference" / "traces" / "no_such_trace.json") is None
    out = capsys.readouterr().out
    assert out.startswith("No recorded GPU trace shipped yet") and out.count("\n") == 1


def test_trace_script_records_a_small_trace_on_the_cpu(tmp_path):
    out = tmp_path / "rnn.json"
    run = subprocess.run([sys.executable, "-m", "labkit.profiling", "trace", "--device", "cpu", "--hidden", "8",
                          "--seq", "5", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    trace = P.load_trace(out)
    assert trace["labkit"]["hidden"] == 8 and trace["labkit"]["seq"] == 5
    s = P.summarize(trace, within="rnn_loop")
    assert [n for n, c, _ in s.top if "lstm_cell" in n] and sum(c for n, c, _ in s.top if "lstm_cell" in n) == 5
    assert out.stat().st_size < 300_000


# ---------------------------------------------------------------- ncu

def test_raw_page_fixture_parses_into_the_table():
    launches = P.parse_ncu_csv(RAW_FIXTURE.read_text())
    assert len(launches) == 2
    add, mm = launches
    assert "vectorized_elementwise_kernel" in add.kernel and add.block == "(128, 1, 1)"
    assert add.metrics["gpu__time_duration.sum"] == (189.73, "usecond")
    rows = P.kernel_table(launches, flops={"xmma": 2.0 * 4096**3})
    a, m = rows
    assert a["duration_us"] == pytest.approx(189.73)
    assert a["dram_bytes"] == pytest.approx(536.88e6 + 268.44e6)
    assert a["dram_gbps"] == pytest.approx((536.88e6 + 268.44e6) / 189.73e-6 / 1e9)
    assert a["flops"] == pytest.approx(67_108_864)             # the fadd counter, thousands separators read
    assert a["intensity"] == pytest.approx(67_108_864 / (536.88e6 + 268.44e6))
    assert a["occupancy_pct"] == pytest.approx(81.07) and a["memory_pct"] == pytest.approx(88.41)
    assert m["flops"] == pytest.approx(2.0 * 4096**3)           # the model's count replaces the SASS counters
    assert m["tflops"] == pytest.approx(2.0 * 4096**3 / 214.05e-6 / 1e12)
    assert m["intensity"] > 100 > a["intensity"]
    text = P.format_table(rows)
    assert "DRAM GB/s" in text and len(text.splitlines()) == 3


def test_details_page_fixture_picks_the_percent_rows():
    (k,) = P.parse_ncu_csv(DETAILS_FIXTURE.read_text())
    assert k.get("memory_pct") == pytest.approx(88.41)      # not the Tbyte/second row of the same name
    assert k.get("duration_us") == pytest.approx(189.73)
    assert k.get("occupancy_pct") == pytest.approx(81.07)
    assert k.get("theoretical_occupancy_pct") == pytest.approx(100)
    assert k.get("dram_bytes") is None


def test_parser_skips_profiler_chatter_and_reports_ncu_errors():
    text = "==PROF== Connected to process 1 (python)\nhello from the program\n" + RAW_FIXTURE.read_text() + \
           "==PROF== Disconnected from process 1\n"
    assert len(P.parse_ncu_csv(text)) == 2
    denied = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
    with pytest.raises(ValueError, match="ERR_NVGPUCTRPERM"):
        P.parse_ncu_csv(denied)
    assert "NVreg_RestrictProfilingToAdminUsers" in P.ncu_problem(denied)
    assert "matched nothing" in P.ncu_problem("==WARNING== No kernels were profiled.")


@pytest.mark.parametrize("path", sorted(DATA.glob("ncu_*.csv")), ids=lambda p: p.name)
def test_every_committed_ncu_report_parses(path):
    """Fixtures and any real report (tests/data/ncu_*.csv): every launch has a name and a duration."""
    rows = P.kernel_table(P.parse_ncu_csv(path.read_text()))
    assert rows and all(r["kernel"] and r["duration_us"] and r["duration_us"] > 0 for r in rows)
    for r in rows:
        for c in ("memory_pct", "sm_pct", "occupancy_pct"):
            assert r[c] is None or 0 <= r[c] <= 100.5


def test_ncu_command_has_the_flags_that_matter():
    cmd = P.ncu_command(["python", "w.py"], "rep", nvtx_ranges=["ncu_add"], launch_skip=3, launch_count=1,
                        kernel_regex="elementwise")
    s = " ".join(cmd)
    assert "--clock-control none" in s and "--nvtx --nvtx-include ncu_add/" in s
    assert "--kernel-name regex:elementwise" in s and "--launch-skip 3" in s and "--launch-count 1" in s
    assert cmd[-2:] == ["python", "w.py"] and "--metrics" in cmd


def test_missing_tools_give_one_clear_message(monkeypatch, tmp_path):
    monkeypatch.setattr(P.shutil, "which", lambda name: None)
    launches, msg = P.run_ncu(P.ncu_command(["python"], tmp_path / "r"))
    assert launches == [] and "ncu is not installed" in msg
    text, msg = P.run_nsys(["python"], tmp_path / "r")
    assert text is None and "nsys is not installed" in msg


def test_workload_ncu_falls_back_from_nvtx_to_kernel_name(monkeypatch, tmp_path):
    seen = []
    fixture = P.parse_ncu_csv(RAW_FIXTURE.read_text())

    def fake_run(cmd):
        seen.append(cmd)
        if "--nvtx" in cmd:
            return [], "ncu ran but profiled no kernel: the NVTX range or kernel-name filter matched nothing"
        return fixture, "ncu profiled 2 kernel launch(es)"

    monkeypatch.setattr(P, "run_ncu", fake_run)
    launches, msg, cmd = P.workload_ncu(tmp_path / "r")
    assert launches == fixture and len(seen) == 2
    assert "--kernel-name" in cmd and "--launch-skip" in cmd and "NVTX ranges:" in msg and "kernel name:" in msg
    monkeypatch.setattr(P, "run_ncu", lambda cmd: ([], "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM)"))
    launches, msg, _ = P.workload_ncu(tmp_path / "r")
    assert launches == [] and msg.count("ERR_NVGPUCTRPERM") == 1   # no retry when counters are not permitted
