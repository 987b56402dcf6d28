"""`labkit grade merge SHARD_OUT... --out DIR`: join the outputs of `labkit grade --shard K/N` runs.

Each shard's folder holds grades.csv, feedback/ and shard.json (which share it graded, of which
roster). The merge refuses shards of different rosters, seeds or columns, a share given twice or
missing, and a student in two shards; it writes one grades.csv and one feedback folder (and one
leaderboard.csv when the shards wrote theirs).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from labkit.grading import safeio
from labkit.grading.report import leaderboard_csv, publish

MAX_CSV = 64 * 2**20


def merge(shard_dirs: list[Path], out: Path) -> int:
    """Merge the shards into `out`; returns the number of students. ValueError says what is wrong."""
    manifests, headers, rows, feedback, board = {}, set(), [], {}, None
    for d in shard_dirs:
        try:
            m = json.loads(safeio.read_bytes(d / "shard.json", 2**24))
        except FileNotFoundError:
            raise ValueError(f"{d} has no shard.json: it is not the --out of a "
                             "`labkit grade --shard K/N` run") from None
        key = (m["shard"], m["of"])
        if key in manifests:
            raise ValueError(f"shard {m['shard']}/{m['of']} is given twice ({manifests[key][0]} and {d})")
        manifests[key] = (d, m)
        table = list(csv.reader(io.StringIO(safeio.read_bytes(d / "grades.csv", MAX_CSV).decode("utf-8"))))
        headers.add(tuple(table[0]))
        if sorted(r[0] for r in table[1:]) != sorted(m["students"]):
            raise ValueError(f"{d}: grades.csv and shard.json name different students (a shard interrupted?)")
        rows += table[1:]
        for student in m["students"]:
            feedback[student] = safeio.read_bytes(d / "feedback" / f"{student}.md", 2**24).decode("utf-8")
        try:
            lb = list(csv.DictReader(io.StringIO(safeio.read_bytes(d / "leaderboard.csv", MAX_CSV).decode("utf-8"))))
        except FileNotFoundError:
            lb = None
        if lb is not None:
            board = (board or []) + [{k: v for k, v in r.items() if k != "rank"} for r in lb]
    first = next(iter(manifests.values()))[1]
    for what in ("of", "roster", "roster_size", "seed", "columns"):
        values = {json.dumps(m[what]) for _, m in manifests.values()}
        if len(values) > 1:
            raise ValueError(f"the shards differ in {what!r} ({', '.join(sorted(values))}): grade every shard with "
                             f"the same submissions folder, seed and notebooks")
    if len(headers) > 1:
        raise ValueError("the shards' grades.csv have different columns")
    missing = sorted(set(range(1, first["of"] + 1)) - {k for k, _ in manifests})
    if missing:
        of = first["of"]
        raise ValueError(f"shard(s) {', '.join(f'{k}/{of}' for k in missing)} missing")
    seen: dict[str, int] = {}
    for (k, _), (_, m) in manifests.items():
        for student in m["students"]:
            if student in seen:
                raise ValueError(f"{student} is in shards {seen[student]} and {k}: the shards overlap")
            seen[student] = k
    if len(seen) != first["roster_size"]:
        raise ValueError(f"the shards hold {len(seen)} students, the roster {first['roster_size']}")
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(next(iter(headers)))
    w.writerows(sorted(rows, key=lambda r: r[0]))
    files = {"grades.csv": buf.getvalue(), **{f"feedback/{s}.md": t for s, t in feedback.items()}}
    if board is not None:  # the shards' leaderboards, ranked again as one class
        files["leaderboard.csv"] = leaderboard_csv(board)
    publish(out, files)
    return len(seen)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labkit grade merge", description=__doc__.split("\n\n")[0])
    ap.add_argument("shards", type=Path, nargs="+", help="the --out folders of the shard runs")
    ap.add_argument("--out", type=Path, required=True, help="where the merged grades.csv and feedback/ go")
    args = ap.parse_args(argv)
    try:
        out = safeio.real_dir(args.out, "--out")
        count = merge([safeio.real_dir(d, "shard folder") for d in args.shards], out)
    except (ValueError, OSError, KeyError) as exc:
        print(f"labkit grade merge: {exc}", file=sys.stderr)
        return 2
    print(f"merged {len(args.shards)} shard(s): {count} student(s) in {out / 'grades.csv'} and {out / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
