"""`labkit grade SUBMISSIONS --out DIR`: grade students' exercise notebooks, each student in its own process.

The parent (this process) loads the instructor's hidden cases (solutions/graded/*.py, joined to the
public modules in labkit/exercises/), makes them from a seed and computes the expected results itself.
A child process per student (labkit.grading.child) runs the student's code cells, calls the student's
functions on the case inputs it is handed and saves what they returned; the parent compares. So
nothing a student redefines or monkeypatches in the child can change the comparison, and outputs
cached for the visible checks fail on the hidden cases. The child runs in an empty directory, under
per-cell and per-exercise time limits (SIGALRM), a per-notebook time limit and a memory limit enforced
from the parent (RLIMIT_AS on the CPU, an RSS watchdog always), with an audit hook that refuses to
open the solutions, the graded tests, other submissions or the output folder, and to start other
programs. grades.csv and feedback/<student>.md are written once every child has finished.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from labkit import cuda
from labkit.grading.judge import Outcome
from labkit.grading.report import StudentReport, fmt_points, write_reports
from labkit.grading.specs import default_seed, load_specs, make_cases
from labkit.grading.student import Context, grade_student
from labkit.grading.submissions import find_submissions, match_notebooks
from labkit.grading.supervise import Limits
from labkit.paths import COURSE_ROOT


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="labkit grade", description=__doc__.split("\n\n")[0])
    ap.add_argument("submissions", type=Path, help="a folder with one folder or notebook per student")
    ap.add_argument("--out", type=Path, required=True, help="where grades.csv and feedback/ go")
    ap.add_argument("--workers", type=int, default=1, help="students graded at once (one GPU each on a multi-GPU host)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds allowed per notebook (default 300)")
    ap.add_argument("--exercise-timeout", type=float, default=None,
                    help="seconds allowed per code cell and per graded function (default: timeout / 4)")
    ap.add_argument("--memory-mb", type=int, default=8192, help="memory limit per student process (default 8192)")
    ap.add_argument("--graded", type=Path, default=COURSE_ROOT / "solutions" / "graded",
                    help="the instructor's graded tests (default: solutions/graded)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the hidden cases (default: graded/SEED)")
    ap.add_argument("--only", nargs="+", default=None, metavar="NOTEBOOK", help="grade only these notebooks")
    ap.add_argument("--device", choices=["auto", "cpu"], default="auto", help="cpu: grade without the GPU")
    args = ap.parse_args(argv)
    if not args.submissions.is_dir():
        ap.error(f"{args.submissions} is not a folder of submissions")
    if args.workers < 1 or args.timeout <= 0 or args.memory_mb < 256:
        ap.error("--workers must be >= 1, --timeout > 0, --memory-mb >= 256")

    import queue

    import torch

    specs = load_specs(args.graded)
    if args.only:
        unknown = [n for n in args.only if n not in specs]
        if unknown:
            ap.error(f"no graded tests for {unknown}; known: {sorted(specs)}")
        specs = {n: specs[n] for n in args.only}
    submissions = find_submissions(args.submissions)
    if not submissions:
        ap.error(f"no submissions (folders or .ipynb files) in {args.submissions}")
    if not args.only:  # grade the notebooks somebody submitted
        used = {n for _, paths in submissions for n in match_notebooks(paths, list(specs))[0]}
        specs = {n: v for n, v in specs.items() if n in used} or specs
    gpu = args.device == "auto" and torch.cuda.is_available()

    seed = args.seed if args.seed is not None else default_seed(args.graded)
    for nb in specs.values():
        for s in nb:
            s.cases = make_cases(s, seed, gpu)
    args.out.mkdir(parents=True, exist_ok=True)
    slots = None
    if gpu:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [
            str(i) for i in range(torch.cuda.device_count())]
        slots = queue.Queue()
        if args.workers > len(ids):
            print(f"labkit grade: {args.workers} workers share {len(ids)} GPU(s); timed exercises are fairest with "
                  f"--workers {len(ids)} (one GPU each)")
        for k in range(args.workers):
            slots.put(ids[k % len(ids)])
    cpus = os.cpu_count() or 1
    workroot = Path(tempfile.mkdtemp(prefix="labkit-grade-"))
    forbidden = [str(p) for p in (args.graded, COURSE_ROOT / "solutions", COURSE_ROOT / "tests",
                                  COURSE_ROOT / ".git", args.out, args.submissions)]
    package = COURSE_ROOT / "labkit"
    for f in (args.out, args.submissions):
        if package.is_relative_to(f.resolve()):
            ap.error(f"{f} holds the labkit package itself, which the students' processes must read: "
                     f"put submissions and --out in folders of their own")
    limits = Limits(args.memory_mb, max(1, cpus // args.workers))
    ctx = Context(specs, args.timeout, args.exercise_timeout or max(5.0, args.timeout / 4), limits, gpu,
                  gpu and cuda.missing() is None, forbidden, workroot, slots)
    columns = [s for nb in specs.values() for s in nb]
    device = "a GPU" if gpu else "the CPU (no GPU)"
    print(f"labkit grade: {len(submissions)} submission(s), {len(columns)} function(s) from {len(specs)} notebook(s), "
          f"on {device}, {args.workers} worker(s)")
    reports: list[StudentReport] = []
    lock = threading.Lock()

    def one(item):
        i, (student, paths) = item
        try:
            r = grade_student(ctx, i, student, paths)
        except Exception as exc:  # a grader bug: this student gets a note, the batch goes on
            r = StudentReport(student, {s.name: Outcome(s.points, 0.0, "failed", [f"grader error: {exc!r}"])
                                        for s in columns}, [f"grader error: {exc!r}"])
        with lock:
            reports.append(r)
            graded = [s for s in columns if r.outcomes[s.name].score is not None]
            print(f"[{len(reports)}/{len(submissions)}] {student}: "
                  f"{fmt_points(sum(r.outcomes[s.name].score for s in graded))} / "
                  f"{fmt_points(sum(s.points for s in graded))} ({r.seconds:.1f} s)", flush=True)
        return r

    try:
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            list(pool.map(one, enumerate(submissions)))
        write_reports(args.out, reports, columns, "a GPU" if gpu else "the CPU")
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    print(f"wrote {args.out / 'grades.csv'} and {len(reports)} feedback file(s) in {args.out / 'feedback'}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
