"""`labkit grade merge SHARD_OUT... --out DIR`: join the outputs of `labkit grade --shard K/N` runs.

Each shard's folder holds grades.csv, feedback/ and shard.json (which share it graded, of which
roster, and a seal of all of it made with a key derived from the hidden tests: seal.graded_key). The
merge refuses a shard whose files differ from what its grader wrote (edited points), student ids
that are not plain file names (`../`, `/`), shards of different rosters, seeds or columns, a share
given twice or missing, and a student in two shards; it writes one grades.csv and one feedback
folder (and one leaderboard.csv when the shards wrote theirs), inside --out only.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from pathlib import Path

from labkit.grading import safeio, seal
from labkit.grading.report import leaderboard_csv, publish
from labkit.paths import COURSE_ROOT

MAX_CSV = 64 * 2**20
STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # what submissions.safe_name makes


def _read(d: Path, name: str) -> str | None:
    try:
        return safeio.read_bytes(d / name, MAX_CSV).decode("utf-8")
    except FileNotFoundError:
        return None


def _check_seal(d: Path, m: dict, graded: Path | None) -> None:
    """ValueError unless d's student ids are plain file names and its files are the ones its grader sealed
    (with the key of the hidden tests in `graded`; None checks the ids only)."""
    bad = [s for s in m.get("students", []) if not isinstance(s, str) or not STUDENT_ID.fullmatch(s)]
    if bad or not isinstance(m.get("students"), list):
        raise ValueError(f"{d}: shard.json names student ids that are not plain file names ({bad[:3]!r}): "
                         f"it was not written by `labkit grade`")
    if graded is None:
        return
    key = seal.graded_key(graded, m.get("seed"))
    files = {name: text for name in ["grades.csv", "leaderboard.csv"] + [f"feedback/{s}.md" for s in m["students"]]
             if (text := _read(d, name)) is not None}
    manifest = {k: v for k, v in m.items() if k != "seal"}
    if not seal.check_files(key, {**files, "shard.json": json.dumps(manifest, sort_keys=True)}, m.get("seal")):
        raise ValueError(f"{d}: its grades.csv, feedback, leaderboard or shard.json differ from what the grader "
                         f"wrote (edited after grading?), or it was graded with other hidden tests than --graded: "
                         f"grade that shard again")


def merge(shard_dirs: list[Path], out: Path, graded: Path | None = None) -> int:
    """Merge the shards into `out`; returns the number of students. ValueError says what is wrong. `graded`:
    the hidden tests the shards were graded with; each shard's seal is checked with their key."""
    manifests, headers, rows, feedback, board = {}, set(), [], {}, None
    for d in shard_dirs:
        try:
            m = json.loads(safeio.read_bytes(d / "shard.json", 2**24))
        except FileNotFoundError:
            raise ValueError(f"{d} has no shard.json: it is not the --out of a "
                             "`labkit grade --shard K/N` run") from None
        if not isinstance(m, dict):
            raise ValueError(f"{d}/shard.json is not a shard manifest")
        _check_seal(d, m, graded)
        key_ = (m["shard"], m["of"])
        if key_ in manifests:
            raise ValueError(f"shard {m['shard']}/{m['of']} is given twice ({manifests[key_][0]} and {d})")
        manifests[key_] = (d, m)
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
    ap.add_argument("--graded", type=Path, default=COURSE_ROOT / "solutions" / "graded",
                    help="the hidden tests the shards were graded with: their seals are checked with them")
    args = ap.parse_args(argv)
    try:
        out = safeio.real_dir(args.out, "--out")
        graded = safeio.real_dir(args.graded, "--graded")
        count = merge([safeio.real_dir(d, "shard folder") for d in args.shards], out, graded)
    except (ValueError, OSError, KeyError) as exc:
        print(f"labkit grade merge: {exc}", file=sys.stderr)
        return 2
    print(f"merged {len(args.shards)} shard(s): {count} student(s) in {out / 'grades.csv'} and {out / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
