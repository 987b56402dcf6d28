"""`labkit grade SUBMISSIONS --out DIR`: grade students' exercise notebooks, each student in its own sandbox.

The parent (this process) loads the instructor's hidden cases (solutions/graded/*.py, joined to the
public modules in labkit/exercises/), makes them from a seed and computes the expected results itself.
A child process per student (labkit.grading.child) runs the student's code cells inside bubblewrap
(labkit.grading.sandbox: the solutions, other submissions and the output folder are not even
mounted), calls the student's functions on the case inputs it is handed and saves what they
returned; the parent reads that back as data and compares. Limits: per-cell and per-exercise time
(SIGALRM in the child), per-notebook time and memory (a watchdog in the parent over every process
the student started), bounded /tmp and /dev/shm. `--shard K/N` grades a deterministic share of the
students; `labkit grade merge` joins the shards' outputs.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import queue
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from labkit import cuda
from labkit.grading import memo, safeio, sandbox, seal, strip
from labkit.grading.judge import Outcome
from labkit.grading.report import StudentReport, fmt_points, publish, write_reports
from labkit.grading.specs import default_seed, load_specs, make_cases
from labkit.grading.student import Context, grade_student
from labkit.grading.submissions import find_submissions, match_notebooks
from labkit.grading.supervise import Limits
from labkit.paths import COURSE_ROOT
from labkit.tools.shard import parse_shard


class GradeError(ValueError):
    """A configuration `labkit grade` refuses; the message says what to do."""


@dataclass
class GradeConfig:
    """What `labkit grade` takes on its command line, for scripts: `grade(GradeConfig(subs, out, workers=2))`."""

    submissions: Path
    out: Path
    workers: int | None = None
    timeout: float = 300
    exercise_timeout: float | None = None
    memory_mb: int = 8192
    graded: Path = COURSE_ROOT / "solutions" / "graded"
    seed: int | None = None
    only: list[str] | None = None
    device: str = "auto"
    shard: tuple[int, int] | None = None
    leaderboard: Path | None = None
    unsafe_no_sandbox: bool = False
    share_gpus: bool = False
    share_cores: bool = False
    memo: Path | str | None = "default"  # outcomes of identical work graded before (grading.memo); None/"off": none
    remeasure: bool = False


def roster_hash(students: list[str]) -> str:
    return hashlib.sha256("\n".join(students).encode()).hexdigest()[:16]


def gpu_ids() -> list[str]:
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def split_cores(cores: list[int], workers: int) -> list[list[int]]:
    """Each worker's CPU cores: disjoint equal shares of `cores` (one core each, round robin, when there are
    more workers than cores)."""
    if workers > len(cores):
        return [[cores[w % len(cores)]] for w in range(workers)]
    per = len(cores) // workers
    return [cores[w * per:(w + 1) * per] for w in range(workers)]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        from labkit.grading.merge import main as merge

        return merge(argv[1:])
    ap = argparse.ArgumentParser(prog="labkit grade", description=__doc__.split("\n\n")[0],
                                 epilog="labkit grade merge SHARD_OUT... --out DIR joins the outputs of --shard runs.")
    ap.add_argument("submissions", type=Path, help="a folder with one folder or notebook per student")
    ap.add_argument("--out", type=Path, required=True, help="where grades.csv and feedback/ go")
    ap.add_argument("--workers", type=int, default=None,
                    help="students graded at once (default: one per GPU on a GPU host, else 1)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds allowed per notebook (default 300)")
    ap.add_argument("--exercise-timeout", type=float, default=None,
                    help="seconds allowed per code cell and per graded function (default: timeout / 4)")
    ap.add_argument("--memory-mb", type=int, default=8192, help="memory limit per student (default 8192)")
    ap.add_argument("--graded", type=Path, default=COURSE_ROOT / "solutions" / "graded",
                    help="the instructor's graded tests (default: solutions/graded)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the hidden cases (default: graded/SEED)")
    ap.add_argument("--only", nargs="+", default=None, metavar="NOTEBOOK", help="grade only these notebooks")
    ap.add_argument("--device", choices=["auto", "cpu"], default="auto", help="cpu: grade without the GPU")
    ap.add_argument("--shard", type=parse_shard, default=None, metavar="K/N",
                    help="grade only share K of N (deterministic); join the outputs with `labkit grade merge`")
    ap.add_argument("--leaderboard", type=Path, default=None, metavar="FILE",
                    help="also write the class leaderboard (scored exercises, e.g. 13_capstone: tokens/s, speed-up, "
                         "loss, points, ranked by speed-up) to FILE; it is always written as --out/leaderboard.csv")
    ap.add_argument("--share-gpus", action="store_true",
                    help="allow more workers than GPUs (timed exercises then share a GPU: the same work may get other "
                         "points)")
    ap.add_argument("--share-cores", action="store_true",
                    help="without a GPU, allow more workers than half the CPU cores while timed exercises are graded "
                         "(they then share cores: the same work may get other points)")
    ap.add_argument("--memo", default="default", metavar="DIR",
                    help="where outcomes are stored by the code graded: identical code graded again by this grader "
                         "on this machine gets the same outcome (default: $LABKIT_GRADE_MEMO, else "
                         "~/.cache/labkit/grades; graders sharing DIR agree; 'off': measure everything)")
    ap.add_argument("--remeasure", action="store_true",
                    help="grade everything again, replacing the stored outcomes of the code it grades")
    ap.add_argument("--unsafe-no-sandbox", action="store_true",
                    help="run students' code without bubblewrap (only for submissions you trust)")
    args = ap.parse_args(argv)
    try:
        grade(GradeConfig(**vars(args)))
    except GradeError as exc:
        ap.error(str(exc))
    except sandbox.SandboxError as exc:
        print(f"labkit grade: {exc}", file=sys.stderr)
        return 2
    return 0


def grade(config: GradeConfig) -> list[StudentReport]:
    """Grade every submission as `labkit grade` does and write grades.csv and the feedback; return the reports.
    GradeError for a configuration it refuses (saying what to do), sandbox.SandboxError where the sandbox
    cannot start."""
    if config.device not in ("auto", "cpu"):
        raise GradeError(f"device {config.device!r}: choose 'auto' or 'cpu'")
    if config.workers is not None and config.workers < 1 or config.timeout <= 0 or config.memory_mb < 256:
        raise GradeError("--workers must be >= 1, --timeout > 0, --memory-mb >= 256")
    try:  # every path absolute, links resolved, before anything runs
        subs_dir = safeio.real_dir(config.submissions, "the submissions folder")
        out_dir = safeio.real_dir(config.out, "--out")
        graded = safeio.real_dir(config.graded, "--graded")
    except OSError as exc:
        raise GradeError(str(exc)) from None
    if not subs_dir.is_dir():
        raise GradeError(f"{config.submissions} is not a folder of submissions")
    for a, b, what in ((out_dir, subs_dir, "--out is inside the submissions folder"),
                       (subs_dir, out_dir, "the submissions folder is inside --out")):
        if a == b or a.is_relative_to(b):
            raise GradeError(f"{what}: put them side by side (e.g. submissions/ and grades/)")
    board_file = None
    if config.leaderboard is not None:
        try:
            board_file = safeio.real_dir(config.leaderboard.parent, "--leaderboard's folder") / config.leaderboard.name
        except OSError as exc:
            raise GradeError(str(exc)) from None
        if board_file.parent.is_relative_to(subs_dir) or board_file.parent.is_relative_to(graded):
            raise GradeError("--leaderboard is inside the submissions or graded folder: a student's file is never "
                             "overwritten; write it next to --out")
        if board_file.name in ("", ".", "..") or board_file.parent == out_dir and board_file.name in (
                "grades.csv", "feedback", "shard.json"):
            raise GradeError(f"--leaderboard {config.leaderboard}: name a file of its own (e.g. leaderboard.csv)")

    import torch

    specs = load_specs(graded)
    if config.only:
        unknown = [n for n in config.only if n not in specs]
        if unknown:
            raise GradeError(f"no graded tests for {unknown}; known: {sorted(specs)}")
        specs = {n: specs[n] for n in config.only}
    everyone = find_submissions(subs_dir)
    if not everyone:
        raise GradeError(f"no submissions (folders or .ipynb files) in {subs_dir}")
    roster = [s.student for s in everyone]
    k, n = config.shard or (1, 1)
    subs = [s for i, s in enumerate(everyone) if i % n == k - 1]  # round robin over the sorted roster
    released = {nb: p for nb in specs if (p := COURSE_ROOT / "exercises" / f"{nb}.ipynb").is_file()}
    if not config.only:  # grade the notebooks somebody submitted (all of them when sharded: shards must agree)
        used = specs if config.shard else {
            nb for s in everyone for nb in match_notebooks(s.notebooks, list(specs), released)[0]}
        specs = {nb: v for nb, v in specs.items() if nb in used} or specs
    gpu = config.device == "auto" and torch.cuda.is_available()
    ids = gpu_ids() if gpu else []
    workers = config.workers or max(1, len(ids))
    cores = sorted(os.sched_getaffinity(0))
    timed = sorted(s.name for nb in specs.values() for s in nb if s.fn.timed)
    if gpu and workers > len(ids) and not config.share_gpus:
        raise GradeError(f"{workers} workers for {len(ids)} GPU(s): each worker grades on a GPU of its own, so "
                         f"that the same work gets the same points; pass --workers {len(ids)}, or --share-gpus to "
                         f"share them")
    if not gpu and timed and workers > max(1, len(cores) // 2) and not config.share_cores:
        raise GradeError(f"{workers} workers on {len(cores)} CPU core(s) while timed exercises ({', '.join(timed)}) "
                         f"are graded: each worker needs 2 cores of its own, so that the same work gets the same "
                         f"points; pass --workers {max(1, len(cores) // 2)}, or --share-cores to share them")

    seed = config.seed if config.seed is not None else default_seed(graded)
    for nb in specs.values():
        for s in nb:
            s.cases = make_cases(s, seed, gpu)
    out_dir.mkdir(parents=True, exist_ok=True)
    slots, core_sets = None, queue.Queue()
    if gpu:
        slots = queue.Queue()
        if workers > len(ids):
            print(f"labkit grade: --share-gpus: {workers} workers share {len(ids)} GPU(s); timed exercises may give "
                  f"the same work other points")
        for w in range(workers):
            slots.put(ids[w % len(ids)])
    for cpus in split_cores(cores, workers):
        core_sets.put(cpus)
    memo_dir = _memo_dir(config, subs_dir)
    workroot = Path(tempfile.mkdtemp(prefix="labkit-grade-")).resolve()
    protected = [graded, COURSE_ROOT / "solutions", COURSE_ROOT / "tests", COURSE_ROOT / ".git", out_dir, subs_dir,
                 workroot] + [memo_dir] * (memo_dir is not None)
    try:
        box = sandbox.make(protected, gpu, config.memory_mb, config.unsafe_no_sandbox)
    except sandbox.SandboxError:
        safeio.rmtree(workroot)
        raise
    if gpu and isinstance(box, sandbox.Bwrap):
        used = ids[:workers]
        box.gpus, why = sandbox.own_gpus(used, [str(torch.cuda.get_device_properties(i).uuid)
                                                for i in range(len(used))], box.devices)
        if why and len(ids) > 1:
            print(f"labkit grade: WARNING: every GPU's device node is visible in the sandbox: {why}")
    copies: dict[tuple, Path] = {}
    copies_lock = threading.Lock()

    def labkit_copy(owned: dict[str, str]) -> Path | None:
        """The labkit a child grading these answers sees: a copy without them (made once per set)."""
        if isinstance(box, sandbox.NoSandbox):
            return None
        key = tuple(sorted(owned.items()))
        with copies_lock:
            if key not in copies:
                folder = workroot / "labkit-copies" / str(len(copies))
                folder.mkdir(parents=True)
                copies[key] = strip.stripped_copy(owned, folder)
            return copies[key]

    limits = Limits(config.memory_mb, max(1, len(cores) // workers))
    ctx = Context(specs, config.timeout, config.exercise_timeout or max(5.0, config.timeout / 4), limits, gpu,
                  gpu and cuda.missing() is None, [str(p) for p in protected], workroot, box, released, slots,
                  core_sets, labkit_copy)
    ctx.memo = _memo(memo_dir, config.remeasure, ctx, graded, seed) if memo_dir is not None else None
    ctx.gpu_shared = bool(gpu and (workers > len(ids) or config.share_gpus))
    columns = [s for nb in specs.values() for s in nb]
    device = "a GPU" if gpu else "the CPU (no GPU)"
    share = f" (shard {k}/{n} of {len(everyone)})" if config.shard else ""
    print(f"labkit grade: {len(subs)} submission(s){share}, {len(columns)} function(s) from {len(specs)} notebook(s), "
          f"on {device}, {workers} worker(s), in {box.name}"
          + (f"; outcomes stored in {ctx.memo.folder}" + (" (--remeasure)" if config.remeasure else "")
             if ctx.memo is not None else ""))
    if isinstance(box, sandbox.NoSandbox):
        print("labkit grade: WARNING: --unsafe-no-sandbox: students' code runs with your user's rights")
    reports: list[StudentReport] = []
    lock = threading.Lock()

    def one(item):
        i, sub = item
        try:
            r = grade_student(ctx, i, sub)
        except Exception as exc:  # a grader bug: this student gets a note, the batch goes on
            r = StudentReport(sub.student, {s.name: Outcome(s.points, 0.0, "failed", [f"grader error: {exc!r}"])
                                            for s in columns}, original=sub.original,
                              incidents=[f"grader error: {exc!r}"])
        with lock:
            reports.append(r)
            graded_fns = [s for s in columns if r.outcomes[s.name].score is not None]
            print(f"[{len(reports)}/{len(subs)}] {r.student}: "
                  f"{fmt_points(sum(r.outcomes[s.name].score for s in graded_fns))} / "
                  f"{fmt_points(sum(s.points for s in graded_fns))} ({r.seconds:.1f} s)", flush=True)
        return r

    manifest = None
    if config.shard:
        manifest = {"shard": k, "of": n, "roster": roster_hash(roster), "roster_size": len(roster),
                    "students": [s.student for s in subs], "seed": seed, "columns": [s.name for s in columns],
                    "device": device}
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(one, enumerate(subs)))
        board = write_reports(out_dir, reports, columns, "a GPU" if gpu else "the CPU", manifest,
                              seal.graded_key(graded, seed))
        if board is not None and board_file is not None and board_file != out_dir / "leaderboard.csv":
            publish(board_file.parent, {board_file.name: board})  # staged, renamed into place, no link followed
    finally:
        safeio.rmtree(workroot)  # iterative: a 1,500-deep folder a student made there is removed too
    print(f"wrote {out_dir / 'grades.csv'} and {len(reports)} feedback file(s) in {out_dir / 'feedback'}")
    if board is not None:
        print(f"wrote the leaderboard: {out_dir / 'leaderboard.csv'}"
              + (f" and {board_file}" if board_file is not None and board_file != out_dir / "leaderboard.csv" else ""))
    elif board_file is not None:
        print("labkit grade: no scored exercise (e.g. 13_capstone) was graded: no leaderboard written")
    return reports


def _memo_dir(config: GradeConfig, subs_dir: Path) -> Path | None:
    """The folder of stored outcomes (--memo), made and resolved; None for 'off'."""
    folder = memo.default_folder() if config.memo == "default" else config.memo
    if folder is None or str(folder).strip().lower() == "off":
        return None
    try:
        folder = safeio.real_dir(Path(folder).expanduser(), "--memo")
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GradeError(f"--memo {folder}: {exc}; pass another folder, or --memo off") from None
    if folder == subs_dir or folder.is_relative_to(subs_dir) or subs_dir.is_relative_to(folder):
        raise GradeError(f"--memo {folder} and the submissions folder overlap: keep the stored outcomes apart")
    return folder


def _memo(folder: Path, remeasure: bool, ctx: Context, graded: Path, seed: int) -> memo.Memo:
    """The store of outcomes by code graded, under a fingerprint of everything else that decides an outcome."""
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if ctx.gpu else []
    grader = memo.fingerprint([COURSE_ROOT / "labkit", graded], seed=seed, gpus=gpus, cuda_build=ctx.cuda_build,
                              timeout=ctx.timeout, exercise_timeout=ctx.exercise_timeout, limits=vars(ctx.limits),
                              sandbox=ctx.box.name, torch=torch.__version__, cpus=os.cpu_count())
    return memo.Memo(folder, grader, remeasure)


if __name__ == "__main__":
    sys.exit(main())
