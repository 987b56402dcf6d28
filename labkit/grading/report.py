"""Reports: grades.csv (one row per student) and feedback/<student>.md, written once grading is done."""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading.judge import NEEDS_GPU, Outcome
from labkit.grading.specs import FnSpec


@dataclass
class StudentReport:
    student: str
    outcomes: dict[str, Outcome]
    notes: list[str] = field(default_factory=list)
    incidents: list[str] = field(default_factory=list)  # time-outs and deaths: also in the CSV
    missing: list[str] = field(default_factory=list)  # graded notebooks not submitted
    seconds: float = 0.0


def fmt_points(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def write_reports(out_dir: Path, reports: list[StudentReport], columns: list[FnSpec], device: str) -> None:
    """grades.csv (one row per student) and feedback/<student>.md, each written atomically."""
    (out_dir / "feedback").mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".grades.csv.tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["student"] + [s.name for s in columns] + ["total", "out_of", "notes"])
        for r in sorted(reports, key=lambda r: r.student):
            total, out_of, row = 0.0, 0.0, [r.student]
            for s in columns:
                o = r.outcomes[s.name]
                if o.score is None:
                    row.append(NEEDS_GPU)
                else:
                    row.append(fmt_points(o.score))
                    total += o.score
                    out_of += s.points
            notes = "; ".join(r.incidents + [f"not submitted: {', '.join(r.missing)}"] * bool(r.missing))[:400]
            w.writerow(row + [fmt_points(total), fmt_points(out_of), notes])
    os.replace(tmp, out_dir / "grades.csv")
    for r in reports:
        path = out_dir / "feedback" / f"{r.student}.md"
        tmp = path.with_suffix(".md.tmp")
        tmp.write_text(feedback_markdown(r, columns, device), encoding="utf-8")
        os.replace(tmp, path)


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
    problems = [s for s in columns if r.outcomes[s.name].status not in ("ok", NEEDS_GPU, "not submitted")]
    if problems:
        lines += ["", "## What went wrong"]
        for s in problems:
            o = r.outcomes[s.name]
            lines += ["", f"### `{s.name}` ({s.notebook})"] + [f"- {m}" for m in o.messages or ["no result"]]
    if r.incidents or r.notes:
        lines += ["", "## Notes from running your notebooks"] + [f"- {n}" for n in (r.incidents + r.notes)[:40]]
    return "\n".join(lines) + "\n"
