"""Graded case for 13_capstone: the grader's own seeds (new weights, corpus and batch order every round)."""
import torch

from labkit.exercises.ex13_capstone import MAX_ROUNDS, ROUNDS, SIZES, capstone_case


def make_trainer_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    kind = "cuda" if gpu else "cpu"
    seeds = torch.randint(1000, 2**30, (MAX_ROUNDS + 1,), generator=g).tolist()
    return [capstone_case(f"the {kind} workload on fresh seeds (a warm-up round, then {ROUNDS} to {MAX_ROUNDS} timed)",
                          SIZES[kind], seeds, kind)]


EXERCISES = {"make_trainer": {"points": 4, "cases": make_trainer_cases}}
