"""`labkit baseline`: performance baselines as data, one per device, and the compare that gates the GPU job.

A baseline is a GPU host's `labkit bench --save` run (median and spread of every kernel case),
plus the notebooks' key figures from `labkit run`, committed as `.ci/baselines/<gpu>.json`.
`labkit baseline compare NEW.json` flags every kernel more than 10% slower than its baseline and
fails when the geometric mean of the speed-ups drops by more than 2%. It is noise-aware: a
difference inside the two runs' combined spread is not counted. A run without a GPU is never compared.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from labkit.paths import CI_DIR, COURSE_ROOT, machine_slug

BASELINES = CI_DIR / "baselines"
FORMAT = "labkit-baseline/1"
MAX_SLOWDOWN = 0.10  # a kernel this much slower than its baseline is flagged
MAX_GEOMEAN_DROP = 0.02  # the geometric mean of speed-ups may drop this much before the compare fails


def path_for(gpu: str, root: Path = BASELINES) -> Path:
    return root / f"{machine_slug(gpu)}.json"


def key(row: dict) -> str:
    return f"{row['kernel']} {row['shape']} {row['dtype']}"


def load(path: Path) -> dict:
    """A baseline or a plain `labkit bench` JSON as {"machine", "bench": {case: {"ms", "spread"}}, "figures"}."""
    data = json.loads(Path(path).read_text())
    rows = data.get("bench", data.get("rows"))
    if not isinstance(rows, list) or "machine" not in data:
        raise ValueError(f"{path}: not a baseline or `labkit bench --save` JSON (needs 'machine' and 'rows')")
    bench = {}
    for r in rows:
        if r.get("ms") and r["ms"] > 0:
            bench[key(r)] = {"ms": float(r["ms"]), "spread": float(r.get("spread") or 0.0), "unit": r.get("unit", "")}
    return {"machine": data["machine"], "bench": bench, "figures": data.get("figures", {}),
            "created": data.get("created"), "path": str(path)}


def make(bench_json: Path, summaries: list[Path] = ()) -> dict:
    """A baseline from a GPU host's bench JSON and (optionally) its `labkit run` summaries."""
    bench = json.loads(Path(bench_json).read_text())
    if bench.get("machine", {}).get("GPU", "none") == "none":
        raise SystemExit(f"labkit baseline save: {bench_json} was measured without a GPU; a baseline needs a GPU run")
    figures = {}
    for s in summaries:
        summary = json.loads(Path(s).read_text())
        if summary.get("quick"):
            raise SystemExit(f"labkit baseline save: {s} is a quick-mode run; use a full-size one (-p quick false)")
        for e in summary.get("notebooks", []):
            if e.get("status") == "ok" and e.get("figures"):
                figures[Path(e["notebook"]).stem] = {n: {"value": f["value"], "unit": f["unit"]}
                                                     for n, f in e["figures"].items()}
    keep = ("kernel", "shape", "dtype", "ms", "spread", "rate", "unit")
    return {"format": FORMAT, "machine": bench["machine"],
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "source": f"labkit bench --save ({Path(bench_json).name})"
                      + (f" and labkit run -p quick false ({len(summaries)} summaries)" if summaries else ""),
            "bench": [{k: r.get(k) for k in keep} for r in bench["rows"]], "figures": figures}


@dataclass
class Case:
    name: str
    base_ms: float
    new_ms: float
    noise: float  # the two runs' combined spread, as a fraction

    @property
    def speedup(self) -> float:
        return self.base_ms / self.new_ms

    @property
    def slowdown(self) -> float:
        return self.new_ms / self.base_ms - 1

    def flagged(self, max_slowdown: float = MAX_SLOWDOWN) -> bool:
        return self.slowdown > max(max_slowdown, self.noise)


@dataclass
class Report:
    cases: list[Case]
    only_base: list[str] = field(default_factory=list)
    only_new: list[str] = field(default_factory=list)
    max_slowdown: float = MAX_SLOWDOWN
    max_drop: float = MAX_GEOMEAN_DROP

    @property
    def geomean(self) -> float:
        return math.exp(sum(math.log(c.speedup) for c in self.cases) / len(self.cases)) if self.cases else 1.0

    @property
    def geomean_noise(self) -> float:
        """The combined spreads carried through the mean of logs: sqrt(sum of squares) / n."""
        return math.sqrt(sum(c.noise ** 2 for c in self.cases)) / len(self.cases) if self.cases else 0.0

    @property
    def flagged(self) -> list[Case]:
        return [c for c in self.cases if c.flagged(self.max_slowdown)]

    @property
    def failed(self) -> bool:
        return 1 - self.geomean > max(self.max_drop, self.geomean_noise)


def compare(base: dict, new: dict, max_slowdown: float = MAX_SLOWDOWN, max_drop: float = MAX_GEOMEAN_DROP) -> Report:
    """Match the cases of two loaded runs; noise = sqrt(spread_base**2 + spread_new**2)."""
    b, n = base["bench"], new["bench"]
    cases = [Case(k, b[k]["ms"], n[k]["ms"], math.hypot(b[k]["spread"], n[k]["spread"])) for k in b if k in n]
    return Report(cases, sorted(set(b) - set(n)), sorted(set(n) - set(b)), max_slowdown, max_drop)


def report_text(r: Report, base: dict, new: dict) -> str:
    width = max([len(c.name) for c in r.cases] + [4])
    lines = [f"baseline {base['path']} ({base['machine'].get('GPU')}, torch {base['machine'].get('torch')}, "
             f"{base.get('created') or 'date unknown'})",
             f"new      {new['path']} ({new['machine'].get('GPU')}, torch {new['machine'].get('torch')})",
             f"{'case':<{width}}  {'baseline':>10}  {'new':>10}  {'speed-up':>8}  {'noise':>6}  verdict"]
    for c in r.cases:
        verdict = ("SLOWER" if c.flagged(r.max_slowdown) else
                   "within noise" if c.slowdown > r.max_slowdown else "ok")
        lines.append(f"{c.name:<{width}}  {c.base_ms:>8.4f}ms  {c.new_ms:>8.4f}ms  {c.speedup:>7.3f}x  "
                     f"{c.noise:>6.1%}  {verdict}")
    if r.only_base:
        lines.append(f"not in the new run ({len(r.only_base)}): {', '.join(r.only_base)}")
    if r.only_new:
        lines.append(f"not in the baseline ({len(r.only_new)}): {', '.join(r.only_new)}")
    lines.append(f"{len(r.flagged)} kernel case(s) more than {r.max_slowdown:.0%} slower than the baseline and "
                 f"outside the combined spread" + (f": {', '.join(c.name for c in r.flagged)}" if r.flagged else ""))
    lines.append(f"geometric mean of speed-ups {r.geomean:.3f}x over {len(r.cases)} cases (noise "
                 f"{r.geomean_noise:.1%}); fails below {1 - max(r.max_drop, r.geomean_noise):.3f}x")
    return "\n".join(lines)


def figure_changes(base: dict, summaries: list[Path], threshold: float = 0.10) -> list[str]:
    """Notebook figures that moved more than `threshold` from the baseline (information only: no direction)."""
    out = []
    for s in summaries:
        for e in json.loads(Path(s).read_text()).get("notebooks", []):
            old = base["figures"].get(Path(e["notebook"]).stem, {})
            for name, f in (e.get("figures") or {}).items():
                was = old.get(name, {}).get("value")
                if isinstance(was, (int, float)) and isinstance(f.get("value"), (int, float)) and was:
                    change = f["value"] / was - 1
                    if abs(change) > threshold:
                        out.append(f"{Path(e['notebook']).stem} {name}: {was:.4g} -> {f['value']:.4g} "
                                   f"{f.get('unit', '')} ({change:+.0%})")
    return out


def _shown(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(COURSE_ROOT)) if path.is_relative_to(COURSE_ROOT) else str(path)


def compare_main(args: argparse.Namespace) -> int:
    new_path = args.files[-1]
    new = load(new_path)
    gpu = new["machine"].get("GPU", "none")
    if gpu in (None, "none"):
        print(f"compare: {new_path} ran without a GPU (Triton interpreter times mean nothing): not compared")
        return 0
    base_path = args.files[0] if len(args.files) == 2 else path_for(gpu)
    if not Path(base_path).is_file():
        print(f"compare: no baseline for this device ({gpu}): {_shown(base_path)} does not exist\n"
              f"  to make one from this run: labkit baseline save {new_path} --summary SUMMARY.json "
              f"-o {_shown(path_for(gpu))}")
        return 2 if args.require else 0
    base = load(base_path)
    if base["machine"].get("GPU") != gpu:
        print(f"compare: no baseline for this device ({gpu}): {base_path} was measured on "
              f"{base['machine'].get('GPU')}")
        return 2 if args.require else 0
    r = compare(base, new, args.max_slowdown, args.max_geomean_drop)
    print(report_text(r, base, new))
    for line in figure_changes(base, args.summary):
        print(f"figure moved  {line}")
    if not r.cases:
        print("compare: FAILED, no kernel case in common with the baseline")
        return 1
    failed = r.failed or (args.strict and r.flagged)
    print(f"compare: {'FAILED' if failed else 'ok'}, geomean {r.geomean:.3f}x, {len(r.flagged)} flagged "
          f"({gpu} vs baseline)")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labkit baseline", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="compare a bench run with its device's baseline (or BASELINE NEW)")
    c.add_argument("files", nargs="+", type=Path, metavar="JSON",
                   help="NEW (baseline from .ci/baselines/<gpu>.json) or BASELINE NEW; bench or baseline JSON")
    c.add_argument("--summary", nargs="*", type=Path, default=[],
                   help="labkit run summary.json files: also list notebook figures that moved more than 10%%")
    c.add_argument("--max-slowdown", type=float, default=MAX_SLOWDOWN, help="flag a case slower than this (0.10)")
    c.add_argument("--max-geomean-drop", type=float, default=MAX_GEOMEAN_DROP,
                   help="fail when the geometric mean of speed-ups drops more than this (0.02)")
    c.add_argument("--strict", action="store_true", help="also fail on any flagged case")
    c.add_argument("--require", action="store_true", help="exit 2 when there is no baseline for this device")
    s = sub.add_parser("save", help="make a baseline from a GPU host's bench JSON (and its notebooks' figures)")
    s.add_argument("bench", type=Path, help="the JSON written by `labkit bench --save PATH`")
    s.add_argument("--summary", nargs="*", type=Path, default=[], help="summary.json of `labkit run -p quick false`")
    s.add_argument("-o", "--output", type=Path, help="file to write (default: .ci/baselines/<gpu>.json)")
    args = ap.parse_args(argv)
    if args.command == "compare":
        if len(args.files) > 2:
            ap.error("compare takes NEW or BASELINE NEW")
        return compare_main(args)
    data = make(args.bench, args.summary)
    out = args.output or path_for(data["machine"]["GPU"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"baseline for {data['machine']['GPU']} written to {out} ({len(data['bench'])} kernel cases, "
          f"figures of {len(data['figures'])} notebooks)")
    return 0
