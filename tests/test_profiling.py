"""labkit.profiling: every name the notebooks, exercises and older code import from it is still
there, and its command line records a small trace on the CPU."""
import subprocess
import sys
from pathlib import Path

from labkit.profiling import chrome_trace, ncu_report, ncu_workload, nsight, rnn_trace, trace_summary
from labkit import profiling as P

ROOT = Path(__file__).resolve().parent.parent


def test_every_public_name_is_importable_from_profiling():
    for module in (chrome_trace, trace_summary, rnn_trace, ncu_report, nsight, ncu_workload):
        public = [n for n, v in vars(module).items()
                  if not n.startswith("_") and getattr(v, "__module__", module.__name__) == module.__name__
                  and (callable(v) or n.isupper())]
        missing = [n for n in public if n not in P.__all__ or getattr(P, n) is not getattr(module, n)]
        assert not missing, f"labkit.profiling lost {module.__name__}'s {missing}"
    used = ["summarize", "load_trace", "summarize_median", "shipped_trace", "timeline", "run_nsys", "workload_ncu",
            "SHIPPED_NCU", "parse_ncu_csv", "ROOT", "kernel_table", "workload_flops", "format_table", "make_rnn",
            "rnn_loop"]   # what notebooks/11_profiling.ipynb and solutions/11_profiling.ipynb use
    assert all(hasattr(P, n) for n in used)


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
