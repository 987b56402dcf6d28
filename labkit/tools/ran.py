"""`labkit ran`: check that a batch run on a GPU host really ran on the GPU, at full size, with its plots.

A notebook that ran on the CPU, skipped a GPU section the host could run, had every claim skipped,
finished implausibly fast against its recorded GPU duration, or kept no plot fails the check; so does
any failed claim, and on a GPU host at full size any inconclusive one (a quiet GPU must decide them).
It reads the summary.json of `labkit run` and the executed notebooks next to it: where each notebook ran and
which sections it skipped are data in their outputs (labkit.device's SKIP_MIME and MACHINE_MIME entries, written
by `labkit.have_gpus` and `labkit.show_machine` beside the lines they print for people).
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from labkit.device import MACHINE_MIME, SKIP_MIME
from labkit.tools import shard

NEEDS_GPUS = re.compile(r"\b(?:(?P<n>\d+)|an?|one)\s+(?:CUDA\s+)?GPUs?\b", re.I)  # a skipped claim's needs=
IMAGES = ("image/png", "image/svg+xml", "image/jpeg")
PLOTTING = re.compile(r"\bplt\.(?:show|subplots|figure|plot)\(|\.plot\(|\.imshow\(")


def _entries(outputs: list[dict], mime: str) -> list[dict]:
    """The data entries a cell's outputs hold under `mime`."""
    return [e for o in outputs if isinstance(e := o.get("data", {}).get(mime), dict)]


def _tags(cell: dict) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _wanted_gpus(match: re.Match) -> int:
    return int(match.group("n")) if match.group("n") else 1


def _skipped(outputs: list[dict]) -> list[dict]:
    """The sections a cell skipped (labkit.have_gpus' entries): section, needs_gpus, device, gpus."""
    return _entries(outputs, SKIP_MIME)


def problems(executed: dict, entry: dict, host_gpus: int, recorded_s: float | None = None,
             min_fraction: float = 0.3, full_size: bool = True) -> list[str]:
    """What shows that this notebook did not really run on a host with `host_gpus` GPUs (0: a CPU host)."""
    found: list[str] = []
    if entry.get("status") != "ok":
        found.append(f"failed: {entry.get('error')}")
    for c in (entry.get("claims") or {}).values():
        if c.get("status") == "failed":
            found.append(f"claim {c.get('name')!r} failed: {c.get('note', '')}"[:400])
        elif c.get("status") == "inconclusive" and host_gpus and full_size:
            found.append(f"claim {c.get('name')!r} inconclusive at full size on a GPU host, where it must decide: "
                         f"{c.get('note', '')}"[:400])
    code = [c for c in executed.get("cells", []) if c.get("cell_type") == "code"]
    if host_gpus:
        outputs = [o for c in code for o in c.get("outputs", [])]
        if any(str(m.get("device", "")) == "cpu" for m in _entries(outputs, MACHINE_MIME)):
            found.append("ran on the CPU on a GPU host (its machine table says device cpu)")
        for s in _skipped(outputs):
            if s["needs_gpus"] <= host_gpus:
                found.append(f"skipped {s['section']!r} (needs {s['needs_gpus']} GPU(s); this host has "
                             f"{host_gpus}, the notebook ran on {s['device']} with {s['gpus']})")
        claims = entry.get("claims") or {}
        skipped = [c for c in claims.values() if c.get("status") == "skipped"]
        if claims and len(skipped) == len(claims):
            found.append(f"all {len(claims)} claims were skipped")
        else:
            for c in skipped:
                m = NEEDS_GPUS.search(c.get("note", ""))
                if m and _wanted_gpus(m) <= host_gpus:
                    found.append(f"claim {c['name']!r} skipped although this host has what it needs ({c['note']})")
        if recorded_s and entry.get("duration_s") is not None and entry["duration_s"] < min_fraction * recorded_s:
            found.append(f"finished in {entry['duration_s']:.1f} s, under {min_fraction:.0%} of the "
                         f"{recorded_s:.1f} s recorded for it on this GPU")
    for i, cell in enumerate(code, 1):
        for tag in (t for t in _tags(cell) if t.startswith("plot:")):
            outs = cell.get("outputs", [])
            if any(k in o.get("data", {}) for o in outs for k in IMAGES):
                continue
            excused = [s for s in _skipped(outs) if s["needs_gpus"] > host_gpus]
            if not excused:
                found.append(f"code cell {i} ({tag}) kept no plot: is MPLBACKEND=Agg set for the kernel?")
    tagged = any(t.startswith("plot:") for c in code for t in _tags(c))
    if not tagged and any(PLOTTING.search(_source(c)) for c in code):
        if not any(k in o.get("data", {}) for c in code for o in c.get("outputs", []) for k in IMAGES):
            found.append("it plots but the executed notebook holds no image: is MPLBACKEND=Agg set for the kernel?")
    return found


def _executed(entry: dict, summary_dir: Path) -> dict:
    import nbformat

    for path in (Path(entry.get("output", "")), summary_dir / Path(entry.get("output", "")).name):
        if path.is_file():
            return nbformat.read(path, as_version=4)
    return {}


def check(summary_path: Path, durations: Path | None = None, min_fraction: float = 0.3,
          expect_gpu: bool = False, allow_quick: bool = False) -> list[str]:
    """Every problem found in a `labkit run` summary, one line each, prefixed by the notebook."""
    summary = json.loads(Path(summary_path).read_text())
    machine = summary.get("machine", {})
    gpu = machine.get("GPU", "none")
    host_gpus = int(machine.get("GPUs", 0) or 0) if gpu != "none" else 0
    found = []
    if expect_gpu and not host_gpus:
        found.append(f"{summary_path}: the run saw no GPU ({summary.get('machine_error') or 'machine GPU: none'})")
    if host_gpus and summary.get("quick") and not allow_quick:
        found.append(f"{summary_path}: ran in quick mode on a GPU host (run with -p quick false)")
    recorded = {}
    if host_gpus and not summary.get("quick"):
        recorded = shard.load_durations(durations or shard.durations_file(gpu))
    for entry in summary.get("notebooks", []):
        name = Path(entry["notebook"]).name
        executed = _executed(entry, Path(summary_path).parent)
        if not executed and entry.get("status") == "ok":
            found.append(f"{name}: its executed notebook {entry.get('output')} is missing")
            continue
        found += [f"{name}: {p}" for p in problems(executed, entry, host_gpus, recorded.get(name), min_fraction,
                                                   full_size=not summary.get("quick"))]
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labkit ran", description=__doc__.split("\n\n")[0])
    ap.add_argument("summaries", nargs="+", type=Path, help="summary.json files written by `labkit run`")
    ap.add_argument("--durations", type=Path, help="recorded durations (default: this GPU's in .ci/durations/)")
    ap.add_argument("--min-fraction", type=float, default=0.3,
                    help="a notebook faster than this fraction of its recorded duration fails (default 0.3)")
    ap.add_argument("--expect-gpu", action="store_true", help="fail when the run saw no GPU")
    ap.add_argument("--allow-quick", action="store_true", help="accept a quick-mode run on a GPU host")
    args = ap.parse_args(argv)
    found, names = [], []
    for path in args.summaries:
        found += check(path, args.durations, args.min_fraction, args.expect_gpu, args.allow_quick)
        names += [Path(e["notebook"]).name for e in json.loads(path.read_text()).get("notebooks", [])]
    for line in found:
        print(f"NOT REALLY RUN  {line}")
    bad = {n for n in names if any(f.startswith(f"{n}: ") for f in found)}
    print(f"really ran: {len(names) - len(bad)} of {len(names)} notebooks"
          + (f"; {len(found)} problem(s): FAILED" if found else ""))
    return 1 if found else 0
