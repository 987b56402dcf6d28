"""Split the notebooks across GPUs or runners by their measured duration, longest first.

Each GPU's notebook durations from its last full-size run are data in the repository
(`.ci/durations/<gpu>.json`). `labkit run --shard K/N` runs shard K of N; `labkit shard plan N`
prints the split; `labkit shard record SUMMARY.json...` stores a run's durations for the next one.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
from pathlib import Path

from labkit.paths import CI_DIR, course_notebooks, machine_slug

DURATIONS = CI_DIR / "durations"


def this_gpu() -> str:
    """This host's first GPU by name, or 'none' (asks torch without choosing a device)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"


class ShardError(ValueError, argparse.ArgumentTypeError):
    """A shard written wrong; argparse shows its message when parse_shard is an option's type."""


def parse_shard(text: str) -> tuple[int, int]:
    """'2/3' -> (2, 3): shard 2 of 3, counted from 1 (`labkit run --shard`, `labkit grade --shard`)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ShardError(f"shard {text!r}: write it as K/N with 1 <= K <= N, e.g. 1/2 for the first of two")
    return int(m.group(1)), int(m.group(2))


def durations_file(gpu: str | None = None, root: Path = DURATIONS) -> Path | None:
    """This GPU's recorded durations, else another machine's (the order of notebooks carries over), else None."""
    own = root / f"{machine_slug(gpu or this_gpu())}.json"
    if own.is_file():
        return own
    others = sorted(root.glob("*.json"))
    return others[0] if others else None


def load_durations(path: Path | None) -> dict[str, float]:
    """notebook file name -> seconds, from a durations file ({} for None)."""
    if path is None:
        return {}
    data = json.loads(Path(path).read_text())
    seconds = data.get("seconds")
    if not isinstance(seconds, dict):
        raise ValueError(f"{path}: expected a 'seconds' table (notebook -> seconds); see `labkit shard record`")
    return {Path(k).name: float(v) for k, v in seconds.items()}


def plan(names: list[str], n: int, durations: dict[str, float]) -> list[list[str]]:
    """Deal notebooks into n shards, longest first, each to the least loaded shard (ties: lowest shard).

    A notebook without a recorded duration counts as the median of those recorded. Each shard
    keeps the course order. The same inputs always give the same split.
    """
    if n < 1:
        raise ValueError("the number of shards must be at least 1")
    known = [durations[x] for x in names if x in durations]
    default = statistics.median(known) if known else 1.0
    cost = {x: durations.get(x, default) for x in names}
    loads, shards = [0.0] * n, [[] for _ in range(n)]
    for name in sorted(names, key=lambda x: (-cost[x], x)):
        i = min(range(n), key=lambda j: (loads[j], j))
        shards[i].append(name)
        loads[i] += cost[name]
    return [sorted(s, key=names.index) for s in shards]


def select(paths: list[Path], shard: str, durations: dict[str, float]) -> list[Path]:
    """The notebooks of shard K/N (paths in, paths out)."""
    k, n = parse_shard(shard)
    chosen = set(plan([p.name for p in paths], n, durations)[k - 1])
    return [p for p in paths if p.name in chosen]


def record(summaries: list[Path], out: Path | None = None) -> Path:
    """Write the durations of `labkit run` summaries (shards of one full-size GPU run) as data."""
    seconds: dict[str, float] = {}
    machine: dict = {}
    for path in summaries:
        summary = json.loads(Path(path).read_text())
        if summary.get("quick", True) or summary.get("machine", {}).get("GPU", "none") == "none":
            raise SystemExit(f"labkit shard record: {path} is not a full-size GPU run (quick mode or no GPU); "
                             "record durations from `labkit run -p quick false` on a GPU host")
        machine = machine or summary["machine"]
        if summary["machine"]["GPU"] != machine["GPU"]:
            raise SystemExit(f"labkit shard record: {path} ran on {summary['machine']['GPU']}, "
                             f"the others on {machine['GPU']}")
        for e in summary.get("notebooks", []):
            if e.get("status") == "ok":
                seconds[Path(e["notebook"]).name] = round(float(e["duration_s"]), 1)
    out = out or DURATIONS / f"{machine_slug(machine['GPU'])}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    keep = ("GPU", "GPUs", "CPU", "torch", "triton", "CUDA (torch build)", "driver", "Python")
    data = {"machine": {k: machine[k] for k in keep if k in machine},
            "source": "labkit run -p quick false (full size), wall seconds per notebook",
            "recorded": datetime.date.today().isoformat(), "seconds": dict(sorted(seconds.items()))}
    out.write_text(json.dumps(data, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labkit shard", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="print how N shards would split the notebooks")
    p.add_argument("n", type=int, help="number of shards (GPUs or runners)")
    p.add_argument("--durations", type=Path, help="durations file (default: this GPU's in .ci/durations/)")
    p.add_argument("--gpu", help="plan with this GPU's durations (default: this host's)")
    r = sub.add_parser("record", help="store a full-size GPU run's notebook durations in .ci/durations/")
    r.add_argument("summaries", nargs="+", type=Path, help="summary.json of `labkit run` (one per shard)")
    r.add_argument("-o", "--output", type=Path, help="file to write (default: .ci/durations/<gpu>.json)")
    args = ap.parse_args(argv)
    if args.command == "record":
        print(f"durations written to {record(args.summaries, args.output)}")
        return 0
    path = args.durations or durations_file(args.gpu)
    durations = load_durations(path)
    names = [p.name for p in course_notebooks()]
    print(f"durations from {path or 'nowhere (no .ci/durations/ file): equal weights'}")
    for k, names_k in enumerate(plan(names, args.n, durations), 1):
        total = sum(durations.get(x, 0.0) for x in names_k)
        print(f"shard {k}/{args.n}  ~{total:.0f} s  {' '.join(names_k)}")
    return 0
