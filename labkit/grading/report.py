"""Reports: grades.csv (one row per student) and feedback/<student>.md, written once grading is done."""
from __future__ import annotations

import csv
import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading import safeio, seal
from labkit.grading.judge import NEEDS_GPU, Outcome
from labkit.grading.specs import FnSpec


@dataclass
class StudentReport:
    student: str
    outcomes: dict[str, Outcome]
    original: str = ""  # the folder or file name as submitted
    notes: list[str] = field(default_factory=list)
    incidents: list[str] = field(default_factory=list)  # time-outs and deaths: also in the CSV
    missing: list[str] = field(default_factory=list)  # graded notebooks not submitted
    choices: list[str] = field(default_factory=list)  # files skipped, several notebooks for one exercise: in the CSV
    seconds: float = 0.0


FORMULA = ("=", "+", "-", "@", "\t", "\r")  # a cell a spreadsheet would run as a formula


def cell(text: str) -> str:
    """A CSV text cell that a spreadsheet shows as text: a leading = + - @ (tab, CR) gets a quote before it."""
    return "'" + text if text.startswith(FORMULA) else text


def fmt_points(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def grades_csv(reports: list[StudentReport], columns: list[FnSpec]) -> str:
    """grades.csv: one row per submission, its original name in `submission`."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["student", "submission"] + [s.name for s in columns] + ["total", "out_of", "notes"])
    for r in sorted(reports, key=lambda r: r.student):
        total, out_of, row = 0.0, 0.0, [cell(r.student), cell(r.original or r.student)]
        for s in columns:
            o = r.outcomes[s.name]
            if o.score is None:
                row.append(NEEDS_GPU)
            else:
                row.append(fmt_points(o.score))
                total += o.score
                out_of += s.points
        notes = "; ".join(r.incidents + r.choices + [f"not submitted: {', '.join(r.missing)}"] * bool(r.missing))
        w.writerow(row + [fmt_points(total), fmt_points(out_of), cell(notes[:600])])
    return buf.getvalue()


LEADERBOARD = ["rank", "student", "submission", "function", "tokens_per_s", "speedup", "loss", "points", "out_of",
               "note"]


def leaderboard_rows(reports: list[StudentReport], columns: list[FnSpec]) -> list[dict]:
    """One row per student and scored function they submitted: their figures, their points (unranked)."""
    rows = []
    for r in reports:
        for s in columns:
            o = r.outcomes[s.name]
            if s.fn.score is None or o.score is None or o.status == "not submitted":
                continue
            d = o.details
            fig = {k: (f"{d[k]:.6g}" if isinstance(d.get(k), (int, float)) else "") for k in ("tokens_per_s", "speedup",
                                                                                            "loss")}
            note = "" if d else (o.messages[0] if o.messages else o.status)
            rows.append({"student": cell(r.student), "submission": cell(r.original or r.student), "function": s.name,
                         **fig, "points": fmt_points(o.score), "out_of": fmt_points(s.points),
                         "note": cell(note[:300])})
    return rows


def leaderboard_csv(rows: list[dict]) -> str:
    """leaderboard.csv: ranked by speed-up (the fastest first); results that scored zero for being wrong last."""
    def key(row: dict):
        return (row["speedup"] == "", -float(row["speedup"] or 0), row["function"], row["student"])

    buf = io.StringIO()
    w = csv.DictWriter(buf, LEADERBOARD)
    w.writeheader()
    for rank, row in enumerate(sorted(rows, key=key), 1):
        w.writerow({**row, "rank": rank if row["speedup"] else ""})
    return buf.getvalue()


def write_reports(out_dir: Path, reports: list[StudentReport], columns: list[FnSpec], device: str,
                  manifest: dict | None = None, shard_key: bytes | None = None) -> str | None:
    """grades.csv, feedback/<student>.md (and shard.json, and leaderboard.csv when a scored function was
    graded), written into a folder made for them, then moved into `out_dir`, replacing what was there
    (links and FIFOs included) without following anything. Returns the leaderboard's text (or None). A shard's
    manifest is written with the seal of the other files under `shard_key` (seal.graded_key)."""
    files = {f"feedback/{r.student}.md": feedback_markdown(r, columns, device) for r in reports}
    files["grades.csv"] = grades_csv(reports, columns)
    board = None
    if any(s.fn.score is not None for s in columns):
        files["leaderboard.csv"] = board = leaderboard_csv(leaderboard_rows(reports, columns))
    if manifest is not None:  # sealed: `labkit grade merge` refuses a shard whose files were edited since
        manifest = dict(manifest, seal=seal.seal_files(shard_key or b"", {
            **files, "shard.json": json.dumps(manifest, sort_keys=True)}))
        files["shard.json"] = json.dumps(manifest, indent=1)
    publish(out_dir, files)
    return board


def publish(out_dir: Path, files: dict[str, str]) -> None:
    """Write `files` (relative name -> text; one level of folders) into out_dir through a staging folder."""
    staging = safeio.staging_dir(out_dir)
    try:
        for name, text in files.items():
            path = staging / name
            path.parent.mkdir(exist_ok=True)
            safeio.write_new(path, text)
        tops = dict.fromkeys(name.split("/")[0] for name in files)
        for top in sorted(tops, key=lambda t: t == "grades.csv"):  # grades.csv last: it says the run is complete
            safeio.publish(staging / top, out_dir / top)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def feedback_markdown(r: StudentReport, columns: list[FnSpec], device: str) -> str:
    graded = [s for s in columns if r.outcomes[s.name].score is not None]
    total = sum(r.outcomes[s.name].score for s in graded)
    out_of = sum(s.points for s in graded)
    lines = [f"# Feedback for {r.student}", "",
             f"Score: **{fmt_points(total)} / {fmt_points(out_of)}** (graded on {device}, on inputs the checks "
             f"in your notebooks do not show: other sizes, dtypes and seeds).", ""]
    skipped = [s for s in columns if r.outcomes[s.name].score is None]
    if skipped:
        lines += [f"Not graded here ({NEEDS_GPU}): " + ", ".join(f"`{s.name}`" for s in skipped)
                  + ". They need a CUDA GPU and nvcc; they do not count against you.", ""]
    if r.missing:
        lines += ["Not submitted (their functions score 0): " + ", ".join(f"`{n}.ipynb`" for n in r.missing), ""]
    lines += ["| notebook | function | score | status |", "|---|---|---|---|"]
    for s in columns:
        o = r.outcomes[s.name]
        score = NEEDS_GPU if o.score is None else f"{fmt_points(o.score)} / {fmt_points(s.points)}"
        lines.append(f"| {s.notebook} | `{s.name}` | {score} | {o.status} |")
    scored = [s for s in columns if s.fn.score is not None and (r.outcomes[s.name].score or 0) > 0]
    if scored:  # points from a score (e.g. a speed-up): what was measured, and what the next points need
        lines += ["", "## Scores"] + [f"- `{s.name}` ({s.notebook}): {m}" for s in scored
                                     for m in r.outcomes[s.name].messages]
    problems = [s for s in columns if r.outcomes[s.name].status not in ("ok", NEEDS_GPU, "not submitted")
                and s not in scored]
    if problems:
        lines += ["", "## What went wrong"]
        for s in problems:
            o = r.outcomes[s.name]
            lines += ["", f"### `{s.name}` ({s.notebook})"] + [f"- {m}" for m in o.messages or ["no result"]]
    if r.incidents or r.choices or r.notes:
        lines += ["", "## Notes from running your notebooks"] + [
            f"- {n}" for n in (r.incidents + r.choices + r.notes)[:40]]
    return "\n".join(lines) + "\n"
