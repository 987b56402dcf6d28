"""What an exercise module declares for each graded function: how to call it and how it is checked."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from labkit.exercises.observe import compare


@dataclass(frozen=True)
class Stage:
    """A second step, run by the grader in a fresh process with no student code (e.g. building CUDA source).

    `take` turns the observation of the student's call into the stage's input (a string), or raises
    ValueError saying what is wrong with it; `run(input, case_args, scratch)` returns one result per
    case: {"obs": observation} or {"error": message}.
    """

    take: Callable[[Any], str]
    run: Callable[[str, list[dict], Path], list[dict]]


@dataclass(frozen=True)
class Rounds:
    """A speed graded in paired rounds that the grader times from outside: each round runs the student's function
    in the grading child and `baseline` in a clean process of its own, on the same fresh inputs.

    `plan(case_args)` -> (thresholds, least timed rounds, most timed rounds); `for_round(case_args, i)` -> what
    round i needs (plain data: its seed, never the later rounds'); `run(make, round_args)` -> the round's
    observation (plain data), all of it timed; `after(make, case_args)`, when given, runs once after the rounds,
    untimed, in the student's process (e.g. counting what a call does); `result(case_args, observations, seconds,
    baseline seconds, after's observation)` -> what the function's `score` reads (round 0, the warm-up, first in
    each list).
    """

    plan: Callable[[dict], tuple[tuple, int, int]]
    for_round: Callable[[dict, int], dict]
    run: Callable[[Callable, dict], Any]
    baseline: Callable
    result: Callable[[dict, list, list[float], list[float], Any], Any]
    after: Callable[[Callable, dict], Any] | None = None


@dataclass(frozen=True)
class Served:
    """A function whose workload the grader serves from outside: the student's function gets a `work()` that asks
    the parent for each call (a frame on the rounds pipe), so the grading child never holds the workload's
    parameters, and the parent counts and times the calls on its own clock.

    `runs(case_args)` -> each run's plan (plain data, kept in the parent); `for_child(plan)` -> what the child's
    round gets; `run(fn, round_args, ask)` -> the round's observation, in the child (`ask()` tells the parent of a
    call and returns its answer); `server(plan)` -> an object whose `answer()` serves the run's calls in the parent
    and whose `retry()` says its own measurement was off (a loaded machine: run it again, up to `attempts` times);
    `result(case_args, observations, servers)` -> what the function's `compare` reads.
    """

    runs: Callable[[dict], list[dict]]
    for_child: Callable[[dict], dict]
    run: Callable[[Callable, dict, Callable[[], dict]], Any]
    server: Callable[[dict], Any]
    result: Callable[[dict, list, list], Any]
    attempts: int = 1


@dataclass(frozen=True)
class Function:
    """One graded function of an exercise notebook.

    call(fn, args) runs the student's `fn` on one case's args (plain data) and returns an observation;
    visible() makes the cases the notebook's check shows; the grader makes hidden ones with the same
    helpers (solutions/graded/). compare(expected, got, rtol, atol) lists what differs. A case is passed
    or failed, unless `score(expected, got)` gives (the fraction of its points earned, what to tell the
    student, figures for the class leaderboard). `answers` names labkit objects that ARE the answer
    ("labkit.serving.batcher.launch_delay"): while this function is graded they are stubs that say so.
    """

    name: str
    call: Callable[[Callable, dict], Any]
    visible: Callable[[], list[dict]] | None = None
    compare: Callable[..., list[str]] = compare
    check: Callable[[Any], bool] | None = None  # a check of its own instead of the visible cases
    prepare: Callable[[str], None] | None = None  # run in the grading child before student code (gets the device)
    stage: Stage | None = None
    requires_triton: bool = False  # the notebook must define a @triton.jit kernel
    needs_gpu: bool = False  # graded only with a CUDA GPU and nvcc, else "needs GPU"
    score: Callable[[Any, Any], tuple[float, list[str], dict]] | None = None  # points from a score
    answers: tuple[str, ...] = ()  # dotted names of labkit objects that are this function's answer
    min_timeout_s: float = 0.0  # its calls get at least this long, whatever --exercise-timeout (e.g. compiling)
    timed: bool = False  # its grade rests on time measured while grading: one worker per GPU, or per 2 CPU cores
    rounds: Rounds | Served | None = None  # timed against a baseline, or its workload served, from outside
