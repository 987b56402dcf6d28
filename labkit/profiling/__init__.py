"""Reading profiles as data, and the command line that records the ones the course ships.

The parts live in their own modules, all importable from here as before: `chrome_trace` (load,
select, trim a torch.profiler trace), `trace_summary` (busy time, gaps, launches, timeline),
`rnn_trace` (the small RNN and its recorder), `ncu_report` (an Nsight Compute CSV as a table),
`nsight` (running ncu and nsys), `ncu_workload` (the two kernels ncu profiles).

`python -m labkit.profiling trace --out PATH` records the small-RNN GPU trace the course ships;
`python -m labkit.profiling ncu --out PATH` profiles two kernels with `ncu` and writes its CSV;
`python -m labkit.profiling check` runs both on a GPU host and prints what they found.

Used by: notebook 11, exercise 11.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from labkit import compat
from labkit.profiling.chrome_trace import (API_CATS, DEVICE_CATS, KEEP_ARGS, KEEP_CATS, ROOT, SHIPPED_TRACE,
                                           complete, is_launch, load_trace, range_of, shipped_trace, spans,
                                           top_level, trim)
from labkit.profiling.ncu_report import (NCU_METRICS, SHIPPED_NCU, KernelLaunch, format_table, kernel_table,
                                         parse_ncu_csv)
from labkit.profiling.ncu_workload import workload, workload_flops, workload_ncu
from labkit.profiling.nsight import export_csv, ncu_command, ncu_problem, run_ncu, run_nsys
from labkit.profiling.rnn_trace import make_rnn, record_rnn_trace, rnn_loop
from labkit.profiling.trace_summary import TraceSummary, busy_and_gaps, summarize, summarize_median, timeline

__all__ = ["API_CATS", "DEVICE_CATS", "KEEP_ARGS", "KEEP_CATS", "ROOT", "SHIPPED_TRACE", "complete", "is_launch",
           "load_trace", "range_of", "shipped_trace", "spans", "top_level", "trim", "NCU_METRICS", "SHIPPED_NCU",
           "KernelLaunch", "format_table", "kernel_table", "parse_ncu_csv", "workload", "workload_flops",
           "workload_ncu", "export_csv", "ncu_command", "ncu_problem", "run_ncu", "run_nsys", "make_rnn",
           "record_rnn_trace", "rnn_loop", "TraceSummary", "busy_and_gaps", "summarize", "summarize_median",
           "timeline", "check", "main"]


def check(out: Path) -> int:
    """On a GPU host: record the trace, run ncu and nsys, sample NVML; print what each found."""
    import torch

    from labkit.profiling import monitor

    if not torch.cuda.is_available():
        print("labkit.profiling check needs a CUDA GPU")
        return 1
    out.mkdir(parents=True, exist_ok=True)
    path = record_rnn_trace(out / "rnn_cell_gpu.json")
    trace = load_trace(path)
    s = summarize(trace)
    print(f"trace {path} ({path.stat().st_size / 1e3:.0f} kB), {trace['labkit']['GPU']}\n{s.table()}")
    assert s.count > 0 and s.launches > 0, "the GPU trace holds no kernels or no launches"
    launches, msg, cmd = workload_ncu(out / "ncu_report")
    print("ncu:", " ".join(cmd), "\n" + msg)
    if launches:
        (out / "ncu_report.csv").write_text(export_csv(out / "ncu_report.ncu-rep", shutil.which("ncu") or "ncu"))
        print(format_table(kernel_table(launches, workload_flops())))
    csv_text, msg = run_nsys([sys.executable, "-m", "labkit.profiling", "workload"], out / "nsys_report")
    print("nsys:", msg)
    if csv_text:
        print(csv_text[:2000])
    sampler = monitor.Sampler(interval_s=0.05)
    with sampler:
        compat.gpu_sleep()(int(2e9))
        torch.cuda.synchronize()
    print(f"NVML: {len(sampler.samples)} samples; {sampler.message or 'ok'}")
    if sampler.samples:
        print(sampler.samples[len(sampler.samples) // 2])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.profiling",
                                 description="Record and read the course's profiles (trace, ncu report, GPU check).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace", help="record the small-RNN trace the course ships (needs a GPU)")
    t.add_argument("--out", type=Path, default=SHIPPED_TRACE)
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--seq", type=int, default=32)
    t.add_argument("--device", default="cuda")
    n = sub.add_parser("ncu", help="profile the workload's two kernels with ncu and write the raw CSV")
    n.add_argument("--out", type=Path, default=SHIPPED_NCU)
    w = sub.add_parser("workload", help="the kernels ncu and nsys profile (an add and a matmul)")
    w.add_argument("--n", type=int, default=2**26)
    w.add_argument("--m", type=int, default=4096)
    c = sub.add_parser("check", help="on a GPU host: trace, ncu, nsys and NVML, printed")
    c.add_argument("--out", type=Path, default=Path("build") / "profiling-check")
    args = ap.parse_args(argv)
    if args.cmd == "trace":
        path = record_rnn_trace(args.out, hidden=args.hidden, seq=args.seq, device=args.device)
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
        print(summarize(load_trace(path)).table())
    elif args.cmd == "ncu":
        with tempfile.TemporaryDirectory() as tmp:
            launches, msg, cmd = workload_ncu(Path(tmp) / "report")
            print(" ".join(cmd) + "\n" + msg)
            if not launches:
                return 1
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(export_csv(Path(tmp) / "report.ncu-rep", shutil.which("ncu") or "ncu"))
        print(f"wrote {args.out}\n" + format_table(kernel_table(parse_ncu_csv(args.out.read_text()), workload_flops())))
    elif args.cmd == "workload":
        workload(args.n, args.m)
    else:
        return check(args.out)
    return 0

