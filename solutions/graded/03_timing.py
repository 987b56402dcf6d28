"""Graded cases for 03_timing: durations spread over a decade and more in each case (so no constant
answer passes), warm-up counts the visible check does not use."""
import torch

from labkit.exercises.ex03_timing import median_ms_case

BANDS = [(1.0, 2.0), (4.0, 7.0), (12.0, 18.0)]  # ms; rtol 0.3 + atol 0.5 around one never reaches another


def median_ms_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    devices = ["cpu"] + (["cuda"] if gpu else [])
    cases = []
    for dev in devices:
        for warmup, reps in [(3, 5), (4, 7)]:
            ms = [round(lo + (hi - lo) * float(torch.rand((), generator=g)), 2) for lo, hi in BANDS]
            ms = [ms[i] for i in torch.randperm(len(ms), generator=g).tolist()]
            outlier = int(torch.randint(0, reps, (), generator=g))
            cases.append(median_ms_case(f"{dev} functions taking {', '.join(map(str, ms))} ms (10x slower on "
                                        f"their first {warmup} calls and on timed call {outlier}), "
                                        f"warmup={warmup}, reps={reps}", dev, ms, warmup, reps, outlier))
    return cases


EXERCISES = {"median_ms": {"points": 1, "cases": median_ms_cases}}
