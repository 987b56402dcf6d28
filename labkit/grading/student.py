"""Grading one student: run their notebooks in child processes (again after a crash), then judge.

Per student, a work folder: run-N/{in,out} for each child launch, stage-<function>/{in,out} for a
second stage. The parent writes only `in` and reads `out` as data (regular files, size-capped,
torch.load with weights_only, results checked against the cases it made). The child's cwd, HOME and
caches are a tmpfs inside the sandbox (scratch/ in the work folder with --unsafe-no-sandbox).
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.grading import rounds, safeio, seal, supervise
from labkit.grading.judge import NEEDS_GPU, Outcome, judge, load_results
from labkit.grading.report import StudentReport
from labkit.grading.sandbox import SCRATCH_DIRS
from labkit.grading.specs import FnSpec
from labkit.grading.submissions import Submission, defines_triton_kernel, extract_code, match_notebooks


@dataclass
class Context:
    specs: dict[str, list[FnSpec]]
    timeout: float
    exercise_timeout: float
    limits: supervise.Limits
    gpu: bool
    cuda_build: bool
    forbidden: list[str]
    workroot: Path
    box: Any  # sandbox.Bwrap or sandbox.NoSandbox
    released: dict[str, Path]  # the released exercise notebooks, to tell an edited notebook from the stub
    gpu_slots: Any = None  # queue of CUDA_VISIBLE_DEVICES values
    core_sets: Any = None  # queue of CPU core lists, one per worker: the child pins itself to one
    labkit_copy: Any = None  # {answer: its notebook} -> the labkit copy without them (grading.strip), or None
    memo: Any = None  # grading.memo.Memo: outcomes of identical work graded before, or None
    gpu_shared: bool = False  # workers share a GPU (--share-gpus): another student's work may keep it busy


def _write_job(in_dir: Path, job: dict, cases: Any = None) -> None:
    """job.json, and cases.pt when `cases` is given (a stage: no student Python reads it)."""
    import torch

    in_dir.mkdir(parents=True)
    (in_dir / "job.json").write_text(json.dumps(job))
    if cases is not None:
        torch.save(cases, in_dir / "cases.pt")


def _frames(cases: dict, jobs: list[dict]) -> dict[str, bytes]:
    """Each notebook's case arguments as torch.save bytes (sent on the child's stdin when it asks)."""
    import io

    import torch

    out = {}
    for j in jobs:
        buf = io.BytesIO()
        torch.save({fn: cases[fn] for fn in j["functions"]}, buf)
        out[j["name"]] = buf.getvalue()
    return out


def _plan(ctx: Context, report: StudentReport, paths: list[Path]) -> list[dict]:
    """The notebooks to run and the functions to grade in each; outcomes for what cannot be graded."""
    matched, notes = match_notebooks(paths, list(ctx.specs), ctx.released,
                                    {nb: [s.name for s in v] for nb, v in ctx.specs.items()})
    report.choices += [n for n in notes if " notebooks for " in n]
    report.notes += [n for n in notes if " notebooks for " not in n]
    jobs = []
    for nb, specs in ctx.specs.items():
        for s in specs:
            if s.fn.needs_gpu and not ctx.cuda_build:
                report.outcomes[s.name] = Outcome(s.points, None, NEEDS_GPU,
                                                  ["needs a CUDA GPU and nvcc: not graded on this machine"])
        if nb not in matched:
            report.missing.append(nb)
            continue
        try:
            cells, cell_notes = extract_code(matched[nb])
        except Exception as exc:
            for s in specs:
                report.outcomes[s.name] = Outcome(s.points, 0.0, "failed",
                                                  [f"could not read {matched[nb].name}: {exc}"])
            continue
        report.notes += [f"{nb}: {n}" for n in cell_notes]
        fns = []
        for s in specs:
            if s.fn.needs_gpu and not ctx.cuda_build:
                continue
            if s.fn.requires_triton and not defines_triton_kernel(cells):
                report.outcomes[s.name] = Outcome(s.points, 0.0, "failed", [
                    f"no @triton.jit kernel in {matched[nb].name}: {s.name} must run a Triton kernel you wrote"])
            else:
                fns.append(s.name)
        jobs.append({"name": nb, "cells": cells, "functions": fns})
    return jobs


def _run_notebooks(ctx: Context, work: Path, jobs: list[dict], env: dict, device: str, report: StudentReport,
                   cpus: list[int] | None = None, tag: str = "",
                   labkit_copy: Path | None = None) -> tuple[dict[str, tuple | list], dict[str, str], set[str]]:
    """Run the notebooks in a child (pinned to `cpus`, seeing `labkit_copy` as labkit), again after a death for
    what is left; ((results file, key, seal) per function, or its results where the parent timed its rounds; why
    some have none; the functions whose results the grader's own failure decided)."""
    by_name = {s.name: s for specs in ctx.specs.values() for s in specs}
    results: dict[str, tuple | list] = {}
    died: dict[str, str] = {}  # function -> why it has no result
    failed: set[str] = set()  # the grader's own failure (rounds.Driver.failed): an outcome not worth storing
    remaining, launch = [j for j in jobs if j["functions"]], 0
    while remaining:
        launch += 1
        run = work / f"run-{tag}{launch}"
        forbidden, allowed = ctx.forbidden + [str(ctx.workroot)], [str(work)]
        served = {fn: by_name[fn] for j in remaining for fn in j["functions"] if by_name[fn].fn.rounds is not None}
        driver = rounds.Driver(served, device, _baseline_env(ctx, work, env), cpus,
                               lambda fn: max(ctx.exercise_timeout, by_name[fn].fn.min_timeout_s),
                               run / "baseline-log.txt", (forbidden, allowed), ctx.gpu_shared) if served else None
        job = {"notebooks": remaining, "device": device, "cell_timeout": ctx.exercise_timeout,
               "exercise_timeout": ctx.exercise_timeout, "memory_mb": ctx.limits.memory_mb,
               "rlimit_as": device == "cpu", "threads": ctx.limits.threads, "cpus": cpus,
               "forbidden": forbidden, "allowed": allowed, "reply_fd": driver.write_fd if driver else None}
        cases = {fn: ([{"args": {}}] if by_name[fn].fn.stage or fn in served  # the parent keeps a timed one's inputs
                      else [{"args": c["args"]} for c in by_name[fn].cases])
                 for j in remaining for fn in j["functions"]}
        _write_job(run / "in", job)
        key = seal.new_key()
        events, killed, rc = supervise.launch(ctx.box, "labkit.grading.child", run, work, env, ctx.limits,
                                              120 + ctx.timeout * len(remaining), ctx.timeout, key, labkit_copy,
                                              _frames(cases, remaining), driver, cpus, report.incidents)
        names = {j["name"] for j in remaining}
        events = [ev for ev in events if ev.get("nb") in names]  # the child's word, about what it was given only
        asked = {fn for j in remaining for fn in j["functions"]}
        results.update({ev["fn"]: (run / "out" / f"{ev['fn']}.pt", key, ev.get("seal")) for ev in events
                        if ev.get("ev") == "fn_done" and ev.get("fn") in asked and ev["fn"] not in served})
        if driver is not None:
            results.update({fn: got for fn, got in driver.results.items() if len(got) == len(served[fn].cases)})
            report.incidents += driver.incidents  # (repeats dropped once, at the end)
            failed |= driver.failed
        done = {ev.get("nb") for ev in events if ev.get("ev") == "nb_done"}
        started = [ev.get("nb") for ev in events if ev.get("ev") == "nb_start"]
        for ev in events:
            if ev.get("ev") == "cell_error":
                report.notes.append(f"{ev['nb']}: code cell {ev.get('cell')} {str(ev.get('error'))[:300]}")
        if all(j["name"] in done for j in remaining):
            break
        current = next((n for n in reversed(started) if n not in done), None)
        why = killed or (f"the process was killed by {supervise.signal_name(rc)}" if rc is not None and rc < 0 else
                         f"the process ended early (exit code {rc}: os._exit, or a crash)")
        if current is None:  # died before running any notebook it was given
            tail = supervise.log_tail(run / "log.txt")
            for j in remaining:
                for fn in j["functions"]:
                    died[fn] = f"the grading process failed before running {j['name']}: {why}" + (
                        f"\n    {tail}" if tail else "")
            break
        where, crashed_fn = "", None
        for ev in reversed(events):
            if ev.get("nb") != current:
                continue
            if ev.get("ev") == "cell_start":
                where = f" while running code cell {ev.get('cell')}"
                break
            if ev.get("ev") == "fn_start":
                where, crashed_fn = f" while grading {ev.get('fn')}", ev.get("fn")
                break
        job_of = next(j for j in remaining if j["name"] == current)
        after = remaining[[j["name"] for j in remaining].index(current) + 1:]
        if crashed_fn in job_of["functions"]:  # run the notebook again for the functions after it
            died[crashed_fn] = f"{why}{where}"
            rest = job_of["functions"][job_of["functions"].index(crashed_fn) + 1:]
            remaining = ([dict(job_of, functions=rest)] if rest else []) + after
        else:  # it died in a code cell: the notebook's functions get no result
            for fn in job_of["functions"]:
                died.setdefault(fn, f"{why}{where}")
            remaining = after
        report.incidents.append(f"{current}: {why}{where}")
    return results, died, failed


def _baseline_env(ctx: Context, work: Path, env: dict) -> dict:
    """The environment of the baseline's clean process (labkit.grading.baseline): the child's, with its caches in
    a folder of the parent's (it runs outside the sandbox; no student code runs in it)."""
    scratch = work / "baseline"
    for sub in SCRATCH_DIRS:
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    return supervise.child_env(ctx.limits, scratch, env.get("LABKIT_DEVICE", "cpu"), env.get("CUDA_VISIBLE_DEVICES"))


def _by_answers(ctx: Context, jobs: list[dict]) -> list[tuple[dict[str, str], list[dict]]]:
    """The notebooks grouped by the labkit answers their graded functions must not reach ({dotted name: its
    notebook}): a notebook with answers runs alone, with those stripped (exercise 13 may use exercise 09's
    kernel from labkit; exercise 09 may not); the others together."""
    by_name = {s.name: s for specs in ctx.specs.values() for s in specs}
    groups: dict[tuple, tuple[dict[str, str], list[dict]]] = {}
    for j in jobs:
        owned = {d: j["name"] for fn in j["functions"] for d in by_name[fn].fn.answers}
        groups.setdefault(tuple(sorted(owned)), (owned, []))[1].append(j)
    return list(groups.values())


def _run_stage(ctx: Context, work: Path, spec: FnSpec, results: list, env: dict) -> Outcome:
    """The function's Stage (e.g. build the CUDA source it returned), in a fresh process with no student Python."""
    first = results[0] if results and isinstance(results[0], dict) else {}
    if "obs" not in first:
        return judge(spec, None, str(first.get("error") or ("timed out" if first.get("timeout") else "no result")))
    try:
        source = spec.fn.stage.take(first["obs"])
    except ValueError as exc:
        return judge(spec, None, str(exc))
    folder = work / f"stage-{spec.name}"
    _write_job(folder / "in", {"function": spec.name, "input": source,
                               "scratch": str(ctx.box.scratch_for(work) / "build")},
               [{"args": c["args"]} for c in spec.cases])
    key = seal.new_key()
    events, killed, rc = supervise.launch(ctx.box, "labkit.grading.stage", folder, work, env, ctx.limits,
                                          ctx.timeout + 300, None, key)
    mac = next((ev.get("seal") for ev in events if ev.get("ev") == "fn_done" and ev.get("fn") == spec.name), None)
    results2, problem = load_results(folder / "out" / f"{spec.name}.pt", key, mac)
    if results2 is None:
        why = problem or killed or f"the build/run process ended with code {rc}"
        tail = supervise.log_tail(folder / "log.txt", 8)
        return judge(spec, None, why + (f"\n    {tail}" if tail else ""))
    return judge(spec, results2, None)


def grade_student(ctx: Context, index: int, sub: Submission) -> StudentReport:
    """Grade one student's notebooks in child processes; never raises for anything the student did. A notebook
    whose code was graded before under this grader (ctx.memo) gets that outcome again instead."""
    t0 = time.monotonic()
    report = StudentReport(sub.student, {s.name: Outcome(s.points) for specs in ctx.specs.values() for s in specs},
                           original=sub.original, choices=list(sub.notes))
    work = ctx.workroot / f"{index:04d}"
    work.mkdir()
    jobs = _plan(ctx, report, sub.notebooks)
    memo = ctx.memo
    keys = {j["name"]: memo.key(j) for j in jobs if j["functions"]} if memo is not None else {}
    cuda_visible = ctx.gpu_slots.get() if ctx.gpu_slots is not None else None
    cpus = ctx.core_sets.get() if ctx.core_sets is not None else None
    try:
        with memo.locked(keys.values()) if memo is not None else contextlib.nullcontext():
            todo = []
            for j in jobs:
                stored = memo.get(keys[j["name"]], j["functions"]) if j["name"] in keys else None
                if stored is None:
                    todo.append(j)
                    continue
                report.outcomes.update(stored[0])
                report.notes += stored[1]
                report.choices.append(f"{j['name']}: the outcome of identical code graded before by this grader on "
                                      "this machine (labkit grade --remeasure grades it again)")
            clean = _grade_jobs(ctx, work, todo, report, cuda_visible, cpus)
            for j in todo:
                if j["name"] in keys and all(clean.get(fn) for fn in j["functions"]):
                    memo.put(keys[j["name"]], {fn: report.outcomes[fn] for fn in j["functions"]},
                             [n for n in report.notes if n.startswith(f"{j['name']}: code cell ")])
    finally:
        if ctx.gpu_slots is not None:
            ctx.gpu_slots.put(cuda_visible)
        if ctx.core_sets is not None:
            ctx.core_sets.put(cpus)
        safeio.rmtree(work)  # its inputs and whatever its processes left (iteratively: any depth) go now
    report.notes = list(dict.fromkeys(report.notes))  # a notebook run again repeats its cells' notes
    report.incidents = list(dict.fromkeys(report.incidents))
    report.seconds = time.monotonic() - t0
    return report


def _grade_jobs(ctx: Context, work: Path, jobs: list[dict], report: StudentReport, cuda_visible: str | None,
                cpus: list[int] | None) -> dict[str, bool]:
    """Run and judge these notebooks' functions into report.outcomes; {function: ran to a verdict} (no crash, no
    time-out, no build stage, no failure of the grader's own: an outcome worth storing)."""
    device = "cuda" if ctx.gpu else "cpu"
    env = supervise.child_env(ctx.limits, ctx.box.scratch_for(work), device, cuda_visible)
    files, died, clean, failed = {}, {}, {}, set()
    for i, (owned, group) in enumerate(_by_answers(ctx, jobs)):  # answers stripped, each in its own child
        copy = ctx.labkit_copy(owned) if owned and ctx.labkit_copy is not None else None
        f, d, bad = _run_notebooks(ctx, work, group, env, device, report, cpus, f"{i}-", copy)
        files.update(f)
        died.update(d)
        failed |= bad
    for nb in jobs:
        for fn in nb["functions"]:
            spec = next(s for s in ctx.specs[nb["name"]] if s.name == fn)
            got = files.get(fn)
            results, problem = ((got, None) if isinstance(got, list)  # timed by the parent (grading.rounds)
                                else load_results(*got) if got is not None else (None, None))
            if results is None:
                report.outcomes[fn] = judge(spec, None, problem or died.get(fn))
            elif spec.fn.stage is not None:
                report.outcomes[fn] = _run_stage(ctx, work, spec, results, env)
            else:
                report.outcomes[fn] = judge(spec, results, None)
            if fn in died and results is not None and report.outcomes[fn].status != "ok":
                report.outcomes[fn].messages.append(died[fn])
            clean[fn] = (results is not None and fn not in died and fn not in failed and spec.fn.stage is None
                         and not any(isinstance(r, dict) and r.get("timeout") for r in results))
    return clean
