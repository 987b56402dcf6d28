"""Reading an Nsight Compute CSV report (a raw page or a details page) into one row per kernel
launch: duration, DRAM bytes and GB/s, throughputs and occupancy as % of peak, FLOPs, intensity.

Used by: notebook 11 (through labkit.profiling).
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any, Sequence

from labkit.paths import COURSE_ROOT

SHIPPED_NCU = COURSE_ROOT / "reference" / "traces" / "ncu_report.csv"

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
            k = launches[key] = KernelLaunch(key, row[col["Kernel Name"]],
                                             row[col["Block Size"]] if "Block Size" in col else "",
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
