"""Reading profiles as data: a torch.profiler Chrome trace summarised (busy time, idle gaps,
launches, top kernels), and an Nsight Compute CSV report parsed into a per-kernel table.

`python -m labkit.profiling trace --out PATH` records the small-RNN GPU trace the course ships;
`python -m labkit.profiling ncu --out PATH` profiles two kernels with `ncu` and writes its CSV;
`python -m labkit.profiling check` runs both on a GPU host and prints what they found.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_TRACE = ROOT / "reference" / "traces" / "rnn_cell_gpu.json"
SHIPPED_NCU = ROOT / "reference" / "traces" / "ncu_report.csv"

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
KEEP_CATS = DEVICE_CATS + API_CATS + ("cpu_op", "user_annotation", "gpu_user_annotation")
KEEP_ARGS = ("correlation", "grid", "block", "device", "stream")


# ---------------------------------------------------------------- Chrome traces

def load_trace(path: str | Path) -> dict[str, Any]:
    """A Chrome/Perfetto trace as torch.profiler writes it (.json or .json.gz)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trace at {path}: record one with prof.export_chrome_trace(path)")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    if isinstance(trace, list):  # the bare-array form of the format
        trace = {"traceEvents": trace}
    if "traceEvents" not in trace:
        raise ValueError(f"{path} is not a Chrome trace (no 'traceEvents')")
    return trace


def _complete(trace: dict[str, Any], cats: Iterable[str]) -> list[dict[str, Any]]:
    cats = set(cats)
    return sorted((e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats
                   and "dur" in e), key=lambda e: float(e["ts"]))


def is_launch(event: dict[str, Any]) -> bool:
    """A host call that puts work on the device: cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch..."""
    name = event.get("name", "")
    return event.get("cat") in API_CATS and ("LaunchKernel" in name or "GraphLaunch" in name)


def top_level(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events not nested inside another of `events` on the same thread (sorted by start)."""
    out, open_end = [], {}
    for e in sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
        tid, start = e.get("tid"), float(e["ts"])
        if start >= open_end.get(tid, float("-inf")):
            out.append(e)
            open_end[tid] = start + float(e["dur"])
    return out


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


def _spans(trace: dict[str, Any], name: str) -> list[dict[str, Any]]:
    spans = [e for e in _complete(trace, ("user_annotation",)) if e["name"] == name]
    if not spans:
        names = sorted({e["name"] for e in _complete(trace, ("user_annotation",))})
        raise KeyError(f"no record_function range {name!r} in the trace; it has: {names[:10]}")
    return spans


def _range(trace: dict[str, Any], name: str, occurrence: int = -1) -> tuple[float, float]:
    span = _spans(trace, name)[occurrence]
    return float(span["ts"]), float(span["ts"]) + float(span["dur"])


def summarize(trace: dict[str, Any], within: str | None = None, track: str = "auto",
              occurrence: int = -1) -> TraceSummary:
    """Busy time, idle gaps, launches and top events of a trace's device track.

    track: "gpu" (kernels, memcpys, memsets), "cpu" (top-level CPU ops: the gaps between them are
    Python and framework time), or "auto" (the GPU when the trace has kernels). `within` names a
    record_function range (its last occurrence, or the `occurrence`-th): only work launched inside
    it counts.
    """
    device = _complete(trace, DEVICE_CATS)
    if track == "auto":
        track = "gpu" if device else "cpu"
    if track not in ("gpu", "cpu"):
        raise ValueError(f"track must be 'gpu', 'cpu' or 'auto', not {track!r}")
    lo, hi = _range(trace, within, occurrence) if within else (float("-inf"), float("inf"))
    launches = [e for e in _complete(trace, API_CATS) if is_launch(e) and lo <= float(e["ts"]) <= hi]
    if track == "gpu":
        if not device:
            raise ValueError("this trace holds no GPU kernels (recorded without ProfilerActivity.CUDA, or on a CPU)")
        if within:
            ids = {e.get("args", {}).get("correlation") for e in launches}
            ids |= {e.get("args", {}).get("correlation") for e in _complete(trace, API_CATS)
                    if lo <= float(e["ts"]) <= hi}
            events = [e for e in device if e.get("args", {}).get("correlation") in ids]
        else:
            events = device
        label = "GPU kernels and copies"
    else:
        ops = [e for e in _complete(trace, ("cpu_op",)) if lo <= float(e["ts"]) and float(e["ts"]) + float(e["dur"]) <= hi]
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
    each = sorted((summarize(trace, within, track, i) for i in range(len(_spans(trace, within)))),
                  key=lambda s: s.busy_fraction)
    return each[len(each) // 2]


def timeline(trace: dict[str, Any], within: str | None = None) -> dict[str, list[tuple[float, float]]]:
    """(start, duration) in us from the first event, per row: 'CPU ops', 'launches', 'GPU kernels'."""
    lo, hi = _range(trace, within) if within else (float("-inf"), float("inf"))
    cpu = [e for e in top_level(_complete(trace, ("cpu_op",))) if lo <= float(e["ts"]) <= hi]
    launches = [e for e in _complete(trace, API_CATS) if is_launch(e) and lo <= float(e["ts"]) <= hi]
    ids = {e.get("args", {}).get("correlation") for e in launches}
    kernels = [e for e in _complete(trace, DEVICE_CATS) if not within or e.get("args", {}).get("correlation") in ids]
    rows = {"CPU ops": cpu, "launches": launches, "GPU kernels": kernels}
    t0 = min([float(e["ts"]) for r in rows.values() for e in r] or [0.0])
    return {k: [(float(e["ts"]) - t0, float(e["dur"])) for e in r] for k, r in rows.items()}


def trim(trace: dict[str, Any], within: str) -> dict[str, Any]:
    """A small copy of a trace: only what happened inside range `within` (and the kernels it launched),
    no Python-function events, and only the args that link launches to kernels."""
    lo, hi = _range(trace, within)
    host = [e for e in _complete(trace, KEEP_CATS) if e.get("cat") not in DEVICE_CATS + ("gpu_user_annotation",)
            and lo <= float(e["ts"]) <= hi]
    ids = {e.get("args", {}).get("correlation") for e in host if e.get("cat") in API_CATS}
    device = [e for e in _complete(trace, DEVICE_CATS + ("gpu_user_annotation",))
              if e.get("args", {}).get("correlation") in ids
              or (e.get("cat") == "gpu_user_annotation" and lo <= float(e["ts"]) <= hi + 1e6)]
    keep = []
    for e in host + device:
        e = {k: v for k, v in e.items() if k != "args"} | {
            "args": {k: v for k, v in e.get("args", {}).items() if k in KEEP_ARGS}}
        keep.append(e)
    meta = [e for e in trace["traceEvents"] if e.get("ph") == "M"]
    out = {k: v for k, v in trace.items() if k in ("schemaVersion", "deviceProperties", "displayTimeUnit", "labkit")}
    out["traceEvents"] = meta + keep
    return out


def shipped_trace(path: Path = SHIPPED_TRACE) -> dict[str, Any] | None:
    """The GPU trace that ships with the course, or None (after one line saying so)."""
    if not path.is_file():
        print(f"No recorded GPU trace shipped yet ({path.relative_to(ROOT)}); on a GPU host make it with: "
              f"python -m labkit.profiling trace --out {path.relative_to(ROOT)}")
        return None
    return load_trace(path)


# ---------------------------------------------------------------- the small RNN

def rnn_loop(cell, x, h, c):
    """Step an LSTM cell over x (seq, batch, features) in a Python loop: one cell call per step."""
    for t in range(x.shape[0]):
        h, c = cell(x[t], (h, c))
    return h


def make_rnn(hidden: int, batch: int, seq: int, device, features: int | None = None, seed: int = 0):
    """An nn.LSTMCell, an nn.LSTM with the same weights, an input and zero states, on `device`."""
    import torch

    features = features or hidden
    g = torch.Generator().manual_seed(seed)
    cell = torch.nn.LSTMCell(features, hidden)
    lstm = torch.nn.LSTM(features, hidden)
    with torch.no_grad():
        for p in list(cell.parameters()) + list(lstm.parameters()):
            p.copy_(torch.rand(p.shape, generator=g) * 0.2 - 0.1)
        lstm.weight_ih_l0.copy_(cell.weight_ih)
        lstm.weight_hh_l0.copy_(cell.weight_hh)
        lstm.bias_ih_l0.copy_(cell.bias_ih)
        lstm.bias_hh_l0.copy_(cell.bias_hh)
    x = torch.randn(seq, batch, features, generator=g)
    h0 = torch.zeros(batch, hidden)
    return cell.to(device), lstm.to(device), x.to(device), h0.to(device), h0.clone().to(device)


def record_rnn_trace(out: Path, hidden: int = 64, seq: int = 32, batch: int = 1, device: str = "cuda") -> Path:
    """Profile the Python-loop LSTM cell (schedule wait=1, warmup=1, active=1) and save a trimmed trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from labkit.device import machine_info, setup

    setup(device=device)
    dev = torch.device(device)
    cell, _, x, h, c = make_rnn(hidden, batch, seq, dev)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    raw = Path(tempfile.mkdtemp()) / "raw.json"
    with torch.no_grad(), profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=1),
                                  on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        for _ in range(3):
            with record_function("rnn_loop"):
                rnn_loop(cell, x, h, c)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            prof.step()
    trace = load_trace(raw)
    info = machine_info()
    trace["labkit"] = {"what": f"nn.LSTMCell stepped in a Python loop: hidden {hidden}, batch {batch}, "
                               f"{seq} steps, no_grad", "GPU": info.get("GPU"), "torch": info["torch"],
                       "CUDA": info["CUDA (torch build)"], "driver": info.get("driver", ""),
                       "hidden": hidden, "seq": seq, "batch": batch}
    small = trim(trace, "rnn_loop")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(small, separators=(",", ":")))
    return out


# ---------------------------------------------------------------- Nsight Compute

# What the ncu table needs: duration, DRAM bytes, throughputs as % of peak, achieved occupancy, FLOPs.
NCU_METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum",
]

# table column -> (names in a raw page / --metrics report, names in a details page), and the unit kind
_COLUMNS = {
    "duration_us": (["gpu__time_duration.sum", "Duration"], "time"),
    "dram_read_bytes": (["dram__bytes_read.sum"], "bytes"),
    "dram_write_bytes": (["dram__bytes_write.sum"], "bytes"),
    "dram_bytes": (["dram__bytes.sum"], "bytes"),
    "memory_pct": (["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "Memory Throughput"], "%"),
    "dram_pct": (["dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM Throughput"], "%"),
    "sm_pct": (["sm__throughput.avg.pct_of_peak_sustained_elapsed", "Compute (SM) Throughput"], "%"),
    "occupancy_pct": (["sm__warps_active.avg.pct_of_peak_sustained_active", "Achieved Occupancy"], "%"),
    "theoretical_occupancy_pct": (["sm__maximum_warps_per_active_cycle_pct", "Theoretical Occupancy"], "%"),
}
_FLOP_COUNTERS = {"sm__sass_thread_inst_executed_op_fadd_pred_on.sum": 1,
                  "sm__sass_thread_inst_executed_op_fmul_pred_on.sum": 1,
                  "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": 2}
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "k": 1e3}
_TIME = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
         "second": 1e6, "s": 1e6}
_FIXED = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
          "Block Size", "Grid Size", "Device", "CC")


def _number(text: str) -> float | str | None:
    """'1,234.5' -> 1234.5; 'n/a' or '' -> None; other text stays text."""
    t = text.strip()
    if t in ("", "n/a", "N/A"):
        return None
    try:
        return float(t.replace(",", ""))
    except ValueError:
        return t


def _to_unit(value: float, unit: str, kind: str) -> float | None:
    """A metric value in the table's unit: us for time, bytes for bytes, % for percentages."""
    u = unit.strip()
    if kind == "%":
        return value if u == "%" else None
    if kind == "time":
        return value * _TIME[u] if u in _TIME else None
    if kind == "bytes":
        if u.endswith("byte") and u[:-4] in _PREFIX:
            return value * _PREFIX[u[:-4]]
        return None
    return value


@dataclass
class KernelLaunch:
    """One profiled kernel launch from an ncu report: its name, launch shape and metrics (value, unit)."""

    id: str
    kernel: str
    block: str
    grid: str
    metrics: dict[str, tuple[Any, str]] = field(default_factory=dict)

    def get(self, column: str) -> float | None:
        """One table column in its unit (us, bytes or %), from whichever name the report used."""
        names, kind = _COLUMNS[column]
        for key, (value, unit) in self.metrics.items():
            if (key in names or key.split(" (")[0] in names) and isinstance(value, float):
                v = _to_unit(value, unit, kind)
                if v is not None:
                    return v
        return None


def parse_ncu_csv(text: str) -> list[KernelLaunch]:
    """Parse `ncu --csv` output: a raw page (one row per launch, a units row under the header) or a
    details / --metrics page (one row per metric). Lines that are not CSV (==PROF==, program output)
    are skipped; an output without a CSV header raises, quoting ncu's own error lines."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"') and '"Kernel Name"' in line), None)
    if start is None:
        said = [line for line in lines if line.startswith("==ERROR==") or "ERR_NVGPUCTRPERM" in line]
        raise ValueError("no ncu CSV header in this output" + (f"; ncu said: {said[0]}" if said else
                         " (run ncu with --csv; --page raw or --page details)"))
    rows = list(csv.reader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"')))))
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    long = "Metric Name" in col
    units: list[str] = [""] * len(header)
    if not long and body and not body[0][col["ID"]].strip():
        units, body = body[0], body[1:]
    launches: dict[str, KernelLaunch] = {}
    for row in body:
        if len(row) < len(header):
            continue
        key = row[col["ID"]]
        k = launches.get(key)
        if k is None:
            k = launches[key] = KernelLaunch(key, row[col["Kernel Name"]], row[col["Block Size"]] if "Block Size" in col else "",
                                             row[col["Grid Size"]] if "Grid Size" in col else "")
        if long:
            name = row[col["Metric Name"]]
            unit = row[col["Metric Unit"]]
            if name in k.metrics and k.metrics[name][1] != unit:  # e.g. 'Memory Throughput' in % and in byte/s
                name = f"{name} ({unit})"
            if name:
                k.metrics.setdefault(name, (_number(row[col["Metric Value"]]), unit))
        else:
            for i, name in enumerate(header):
                if name not in _FIXED:
                    k.metrics[name] = (_number(row[i]), units[i])
    return list(launches.values())


def kernel_table(launches: Sequence[KernelLaunch], flops: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One row per launch: duration, DRAM bytes and GB/s, throughputs and occupancy (% of peak),
    FLOPs (the SASS fp32 counters, or `flops[kernel substring]` from a model) and intensity."""
    table = []
    for k in launches:
        row: dict[str, Any] = {"id": k.id, "kernel": k.kernel, "block": k.block, "grid": k.grid}
        for column in _COLUMNS:
            row[column] = k.get(column)
        if row["dram_bytes"] is None and row["dram_read_bytes"] is not None:
            row["dram_bytes"] = row["dram_read_bytes"] + (row["dram_write_bytes"] or 0.0)
        counted = [(k.metrics[n][0] * _PREFIX.get(k.metrics[n][1][:-4], 1.0), w) for n, w in _FLOP_COUNTERS.items()
                   if n in k.metrics and isinstance(k.metrics[n][0], float)]
        row["flops"] = sum(v * w for v, w in counted) if counted else None
        for part, value in (flops or {}).items():
            if part in k.kernel:
                row["flops"] = value
        ok = row["duration_us"] and row["dram_bytes"]
        row["dram_gbps"] = row["dram_bytes"] / row["duration_us"] / 1e3 if ok else None
        row["intensity"] = row["flops"] / row["dram_bytes"] if ok and row["flops"] else None
        row["tflops"] = row["flops"] / row["duration_us"] / 1e6 if row["duration_us"] and row["flops"] else None
        table.append(row)
    return table


def format_table(table: Sequence[dict[str, Any]], width: int = 40) -> str:
    """The ncu kernel table as aligned text."""
    cols = [("duration_us", "time us", ".2f"), ("dram_gbps", "DRAM GB/s", ",.0f"), ("memory_pct", "mem %", ".1f"),
            ("sm_pct", "SM %", ".1f"), ("occupancy_pct", "occup. %", ".1f"), ("intensity", "FLOP/B", ".3g"),
            ("tflops", "TFLOP/s", ".3g")]
    head = f"{'kernel':<{width}}" + "".join(f"{h:>11}" for _, h, _ in cols)
    lines = [head]
    for r in table:
        name = r["kernel"] if len(r["kernel"]) <= width else r["kernel"][:width - 3] + "..."
        cells = "".join(f"{format(r[c], f) if r[c] is not None else '-':>11}" for c, _, f in cols)
        lines.append(f"{name:<{width}}{cells}")
    return "\n".join(lines)


def ncu_command(target: Sequence[str], report: str | Path, nvtx_ranges: Sequence[str] = (),
                kernel_regex: str | None = None, launch_skip: int = 0, launch_count: int | None = None,
                metrics: Sequence[str] = NCU_METRICS, section_set: str | None = None) -> list[str]:
    """The ncu command line: profile `target`'s kernels inside the NVTX push/pop ranges or matching
    the regex, clocks left alone (--clock-control none), metrics into `report`.ncu-rep."""
    cmd = ["ncu", "--clock-control", "none", "--target-processes", "all", "--force-overwrite",
           "--export", str(report)]
    if nvtx_ranges:
        cmd.append("--nvtx")
        for r in nvtx_ranges:
            cmd += ["--nvtx-include", f"{r}/"]
    if kernel_regex:
        cmd += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_skip:
        cmd += ["--launch-skip", str(launch_skip)]
    if launch_count:
        cmd += ["--launch-count", str(launch_count)]
    if section_set:
        cmd += ["--set", section_set]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    return cmd + list(target)


def ncu_problem(output: str) -> str | None:
    """One line saying why ncu made no report (counters not permitted, nothing matched), or None."""
    if "ERR_NVGPUCTRPERM" in output:
        return ("ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): an admin must allow "
                "them for all users (nvidia kernel module option NVreg_RestrictProfilingToAdminUsers=0), or run ncu as root")
    if "No kernels were profiled" in output:
        return "ncu ran but profiled no kernel: the NVTX range or kernel-name filter matched nothing"
    errors = [line for line in output.splitlines() if line.startswith("==ERROR==")]
    return errors[0] if errors else None


def run_ncu(cmd: Sequence[str], timeout: float = 240) -> tuple[list[KernelLaunch], str]:
    """Run an ncu command built by `ncu_command`, import its report as raw CSV and parse it.

    Returns (launches, message); launches is empty and message says why when ncu is missing,
    counters are not permitted, or nothing was profiled."""
    exe = shutil.which(cmd[0])
    if exe is None:
        return [], "ncu is not installed here (it comes with the CUDA toolkit or as Nsight Compute)"
    try:
        run = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=timeout, env=_env())
    except subprocess.TimeoutExpired:
        return [], f"ncu did not finish within {timeout:.0f} s: select fewer kernels (--launch-count) or metrics"
    said = run.stdout + run.stderr
    report = cmd[cmd.index("--export") + 1]
    rep = Path(report if report.endswith(".ncu-rep") else report + ".ncu-rep")
    if not rep.is_file():
        return [], ncu_problem(said) or f"ncu exited with {run.returncode} and wrote no report: {said.strip()[-300:]}"
    csv_text = export_csv(rep, exe)
    try:
        launches = parse_ncu_csv(csv_text)
    except ValueError as e:
        return [], f"{ncu_problem(said) or e}"
    if not launches:
        return [], ncu_problem(said) or "ncu's report holds no kernel"
    return launches, f"ncu profiled {len(launches)} kernel launch(es) into {rep}"


def _env() -> dict[str, str]:
    """This environment, with the repository on PYTHONPATH so `python -m labkit...` works from any folder."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def export_csv(report: Path, exe: str = "ncu") -> str:
    """A saved .ncu-rep as raw-page CSV in base units (`ncu --import R --csv --page raw`; needs no GPU)."""
    out = subprocess.run([exe, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"],
                         capture_output=True, text=True, timeout=120)
    return out.stdout


def workload(n: int = 2**26, m: int = 4096, repeats: int = 3) -> None:
    """The ncu target: an fp32 add (bandwidth-bound) and a bf16 matmul (compute-bound), each run once
    inside its own NVTX range after `repeats` warm-up runs outside any range."""
    import torch

    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    for _ in range(repeats):
        a + b, x @ y
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("ncu_add")
    a + b
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_push("ncu_matmul")
    x @ y
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


def workload_flops(n: int = 2**26, m: int = 4096) -> dict[str, float]:
    """FLOPs of the workload's kernels from the model, keyed by a substring of the kernel name."""
    return {"elementwise": float(n), "gemm": 2.0 * m**3, "nvjet": 2.0 * m**3, "xmma": 2.0 * m**3,
            "cutlass": 2.0 * m**3}


def workload_ncu(report: Path, n: int = 2**26, m: int = 4096) -> tuple[list[KernelLaunch], str, list[str]]:
    """Profile the workload's two kernels: by NVTX range; if that matches nothing, by kernel name
    (skipping the warm-up launches); if ncu refuses a metric name, with the 'basic' section set.
    Returns (launches, message, the command that produced them)."""
    target = [sys.executable, "-m", "labkit.profiling", "workload", "--n", str(n), "--m", str(m)]
    attempts = [("NVTX ranges", dict(nvtx_ranges=["ncu_add", "ncu_matmul"], launch_count=4)),
                ("kernel name", dict(kernel_regex="vectorized_elementwise", launch_skip=3, launch_count=1)),
                ("NVTX ranges, --set basic", dict(nvtx_ranges=["ncu_add", "ncu_matmul"], launch_count=4,
                                                  metrics=(), section_set="basic"))]
    said = []
    for label, kw in attempts:
        cmd = ncu_command(target, report, **kw)
        launches, msg = run_ncu(cmd)
        said.append(f"{label}: {msg}")
        if launches or "not installed" in msg or "ERR_NVGPUCTRPERM" in msg:
            break
    return launches, "; ".join(said), cmd


def run_nsys(target: Sequence[str], report: str | Path, timeout: float = 120) -> tuple[str | None, str]:
    """`nsys profile --trace cuda,nvtx,osrt` then `nsys stats` (kernel summary as CSV).
    Returns (csv text or None, message): nsys may be missing or unable to write its report."""
    exe = shutil.which("nsys")
    if exe is None:
        return None, "nsys is not installed here (it comes with the CUDA toolkit or as Nsight Systems)"
    cmd = [exe, "profile", "--trace", "cuda,nvtx,osrt", "--sample", "none", "--force-overwrite", "true",
           "--output", str(report), *target]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
    except subprocess.TimeoutExpired:
        return None, f"nsys did not finish within {timeout:.0f} s on this machine"
    rep = Path(str(report) + ".nsys-rep")
    if run.returncode != 0 or not rep.is_file():
        last = (run.stderr or run.stdout).strip().splitlines()[-1:] or [f"exit status {run.returncode}"]
        return None, f"nsys could not make a report on this machine: {last[0][:300]}"
    try:
        stats = subprocess.run([exe, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv", "--force-export",
                                "true", str(rep)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"nsys stats did not finish within {timeout:.0f} s"
    if stats.returncode != 0:
        return None, f"nsys stats failed: {(stats.stderr or stats.stdout).strip()[-300:]}"
    return stats.stdout, f"nsys wrote {rep}"


# ---------------------------------------------------------------- command line

def check(out: Path) -> int:
    """On a GPU host: record the trace, run ncu and nsys, sample NVML; print what each found."""
    import torch

    from labkit import monitor

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
        torch.cuda._sleep(int(2e9))
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


if __name__ == "__main__":
    sys.exit(main())
