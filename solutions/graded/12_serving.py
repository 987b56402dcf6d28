"""Graded cases for 12_serving: other seeds, rates, batch sizes and delays than the visible check."""
import torch

from labkit.serving.batchsim import poisson_arrivals
from labkit.exercises.ex12_serving import burst, trace_case


def launch_delay_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    def pick(options):
        return options[int(torch.randint(0, len(options), (), generator=g))]

    def seed() -> int:
        return int(torch.randint(0, 2**31, (), generator=g))

    cases = []
    for _ in range(2):  # bursts larger than the batch, at a random offset
        b, d = pick([4, 7, 16]), pick([0.5e-3, 3e-3])
        n, start = int(torch.randint(2 * b + 1, 5 * b, (), generator=g)), float(torch.rand((), generator=g))
        cases.append(trace_case(f"a burst of {n} requests within 1 ms at t={start:.3f} s, max_batch={b}, "
                                f"max_delay={d * 1e3:g} ms", burst(start, n, 1e-3), b, d))
    gap = float(2 + 3 * torch.rand((), generator=g)) * 1e-2  # lonely requests, far apart
    cases.append(trace_case(f"5 lonely requests {gap * 1e3:.1f} ms apart, max_batch=32, max_delay=4 ms",
                            [i * gap for i in range(5)], 32, 4e-3))
    for rate in (300, 2500, 12000):  # steady Poisson load, light to past saturation
        b, d = pick([8, 12, 32]), pick([0.5e-3, 1.5e-3, 5e-3])
        cases.append(trace_case(f"Poisson arrivals at {rate}/s (250 requests), max_batch={b}, "
                                f"max_delay={d * 1e3:g} ms", poisson_arrivals(rate, 250, seed()), b, d))
    cases.append(trace_case("Poisson arrivals at 4000/s (150 requests), max_batch=16, max_delay=0",
                            poisson_arrivals(4000, 150, seed()), 16, 0.0))
    cases.append(trace_case("Poisson arrivals at 2000/s (100 requests), max_batch=1, max_delay=2 ms",
                            poisson_arrivals(2000, 100, seed()), 1, 2e-3))
    return cases


EXERCISES = {"launch_delay": {"points": 2, "cases": launch_delay_cases}}
