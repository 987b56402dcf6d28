"""Graded cases for 03_timing: durations and warm-up counts the visible check does not use."""
import torch

from labkit.exercises.ex03_timing import median_ms_case


def median_ms_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    devices = ["cpu"] + (["cuda"] if gpu else [])
    cases = []
    for dev in devices:
        for warmup, reps in [(3, 5), (4, 7)]:
            ms = round(2.0 + 3.0 * float(torch.rand((), generator=g)), 2)
            outlier = int(torch.randint(0, reps, (), generator=g))
            cases.append(median_ms_case(f"a {dev} function taking {ms} ms (10x slower on its first {warmup} calls "
                                        f"and on timed call {outlier}), warmup={warmup}, reps={reps}",
                                        dev, ms, warmup, reps, outlier))
    return cases


EXERCISES = {"median_ms": {"points": 1, "cases": median_ms_cases}}
