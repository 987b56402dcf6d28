"""Reading a Chrome/Perfetto trace as torch.profiler writes it: load it, pick its complete events
(host calls that launch work, top-level ops, a record_function range), and trim it to one range.

Used by: notebook 11 (through labkit.profiling).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from labkit.paths import COURSE_ROOT as ROOT

SHIPPED_TRACE = ROOT / "reference" / "traces" / "rnn_cell_gpu.json"

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
KEEP_CATS = DEVICE_CATS + API_CATS + ("cpu_op", "user_annotation", "gpu_user_annotation")
KEEP_ARGS = ("correlation", "grid", "block", "device", "stream")


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


def complete(trace: dict[str, Any], cats: Iterable[str]) -> list[dict[str, Any]]:
    """The complete ("X") events of categories `cats`, by start time."""
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


def spans(trace: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Every occurrence of record_function range `name`, in order; a KeyError names the ranges there are."""
    found = [e for e in complete(trace, ("user_annotation",)) if e["name"] == name]
    if not found:
        names = sorted({e["name"] for e in complete(trace, ("user_annotation",))})
        raise KeyError(f"no record_function range {name!r} in the trace; it has: {names[:10]}")
    return found


def range_of(trace: dict[str, Any], name: str, occurrence: int = -1) -> tuple[float, float]:
    """(start, end) in us of one occurrence of range `name` (the last by default)."""
    span = spans(trace, name)[occurrence]
    return float(span["ts"]), float(span["ts"]) + float(span["dur"])


def trim(trace: dict[str, Any], within: str) -> dict[str, Any]:
    """A small copy of a trace: only what happened inside range `within` (and the kernels it launched),
    no Python-function events, and only the args that link launches to kernels."""
    lo, hi = range_of(trace, within)
    host = [e for e in complete(trace, KEEP_CATS) if e.get("cat") not in DEVICE_CATS + ("gpu_user_annotation",)
            and lo <= float(e["ts"]) <= hi]
    ids = {e.get("args", {}).get("correlation") for e in host if e.get("cat") in API_CATS}
    device = [e for e in complete(trace, DEVICE_CATS + ("gpu_user_annotation",))
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
