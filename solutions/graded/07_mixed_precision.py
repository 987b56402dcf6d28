"""Graded cases for 07_mixed_precision: where the inf hides, long step sequences, other factors."""
import torch

from labkit.exercises.ex07_mixed_precision import found_inf_case, update_scale_case


def found_inf_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    cases = [found_inf_case("no gradients at all", [], dev, False)]
    for bad, dtype in [(None, torch.float16), (float("-inf"), torch.float32), (float("nan"), torch.bfloat16),
                       (float("inf"), torch.float16), (None, torch.float32)]:
        grads = [torch.randn(int(torch.randint(1, 50, (), generator=g)), generator=g).to(dtype) for _ in range(4)]
        grads.insert(2, None)
        if bad is not None:
            i = int(torch.randint(0, 4, (), generator=g))
            i = i if i < 2 else i + 1
            grads[i][int(torch.randint(0, grads[i].numel(), (), generator=g))] = bad
        about = f"5 {dtype} gradients (one None), {'with ' + str(bad) if bad is not None else 'all finite'}"
        cases.append(found_inf_case(about, grads, dev, bad is not None))
    return cases


def _reference(scale, found_inf, tracker, growth_factor, backoff_factor, growth_interval):
    if found_inf:
        return scale * backoff_factor, 0
    tracker += 1
    if tracker == growth_interval:
        return scale * growth_factor, 0
    return scale, tracker


def update_scale_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    cases = []
    for interval, gf, bf, n in [(3, 2.0, 0.5, 20), (1, 1.5, 0.25, 8), (5, 4.0, 0.5, 30)]:
        found = [bool(v) for v in (torch.rand(n, generator=g) < 0.25)]
        scale, tracker, seen = 65536.0, 0, []
        for f in found:
            scale, tracker = _reference(scale, f, tracker, gf, bf, interval)
            seen.append((scale, tracker))
        cases.append(update_scale_case(f"{n} steps, growth_interval={interval}, growth_factor={gf}, "
                                       f"backoff_factor={bf}", 65536.0, found, gf, bf, interval, seen, rtol=1e-12))
    return cases


EXERCISES = {
    "found_inf": {"points": 1, "cases": found_inf_cases},
    "update_scale": {"points": 1, "cases": update_scale_cases},
}
