"""Pipeline schedules as a model, with no processes: GPipe and 1F1B as per-stage orders of forward (F) and backward
(B) steps, their bubble, `simulate` (the timeline of equal-cost steps), and `emulate` (the same order run on real
stages in one process, so a student's order can be checked for what it computes).

Used by: notebook 10, exercise 10 (through labkit.parallel.pipeline, which runs these orders on p processes).
"""
from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from torch import nn

Step = tuple[str, int]   # ("F" or "B", micro-batch)


def order_gpipe(stage: int, p: int, m: int) -> list[Step]:
    """GPipe: every forward, then every backward (all m micro-batches' activations are kept)."""
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def order_1f1b(stage: int, p: int, m: int) -> list[Step]:
    """1F1B: p-1-stage warm-up forwards, then alternate one forward, one backward, then drain the backwards."""
    warm = min(p - 1 - stage, m)
    steps: list[Step] = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        steps += [("F", warm + i), ("B", i)]
    return steps + [("B", i) for i in range(m - warm, m)]


ORDERS = {"gpipe": order_gpipe, "1f1b": order_1f1b}


def bubble_formula(p: int, m: int) -> float:
    """The idle share of each stage with equal stage costs: (p-1)/(m+p-1)."""
    return (p - 1) / (m + p - 1)


def in_flight(steps: list[Step]) -> int:
    """The most micro-batches forwarded but not yet backwarded (activations held) along an order."""
    live = peak = 0
    for op, _ in steps:
        live += 1 if op == "F" else -1
        peak = max(peak, live)
    return peak


def check_order(steps: list[Step], m: int) -> None:
    """ValueError unless the order runs each F and B once per micro-batch, F(i) before B(i), F's and B's in turn."""
    if sorted(steps) != sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)]):
        raise ValueError(f"an order must hold F(i) and B(i) once for each of the {m} micro-batches: {steps}")
    for op in "FB":
        if [i for o, i in steps if o == op] != list(range(m)):
            raise ValueError(f"the {op} steps must take micro-batches 0..{m - 1} in turn: {steps}")
    for i in range(m):
        if steps.index(("B", i)) < steps.index(("F", i)):
            raise ValueError(f"B({i}) comes before F({i}): a backward needs its forward's activations")


def simulate(p: int, m: int, schedule: str = "1f1b", f: float = 1.0, b: float = 2.0,
             order=None, cost=None) -> list[dict]:
    """The schedule as a model: events (stage, op, mb, start, end) with forward cost f and backward b, or
    `cost(stage, op, mb)` for each step's own; every step starts as soon as its stage and its input are free."""
    order = order or ORDERS[schedule]
    cost = cost or (lambda s, op, i: f if op == "F" else b)
    orders = [order(s, p, m) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    free, pos, events = [0.0] * p, [0] * p, []
    while any(pos[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            op, i = orders[s][pos[s]]
            dep = ("F", s - 1, i) if op == "F" and s > 0 else ("B", s + 1, i) if op == "B" and s < p - 1 else None
            if op == "B" and s == p - 1:
                dep = ("F", s, i)
            if dep is not None and dep not in done:
                continue
            start = max(free[s], done.get(dep, 0.0))
            free[s] = done[(op, s, i)] = start + cost(s, op, i)
            events.append({"stage": s, "op": op, "mb": i, "start": start, "end": free[s]})
            pos[s] += 1
            moved = True
        if not moved:
            raise ValueError(f"the orders deadlock: every stage waits "
                             f"({[orders[s][pos[s]] for s in range(p) if pos[s] < len(orders[s])]})")
    return events


def replay(events: list[dict], p: int, m: int, schedule: str) -> list[dict]:
    """The schedule played with the durations the events measured, and nothing else: no transfer, no wait."""
    took = {(e["stage"], e["op"], e["mb"]): e["end"] - e["start"] for e in events}
    return simulate(p, m, schedule, cost=lambda s, op, i: took[(s, op, i)])


def bubble(events: list[dict]) -> dict:
    """Makespan, and each stage's idle share of it (1 - busy / makespan), from recorded or simulated events."""
    t0, t1 = min(e["start"] for e in events), max(e["end"] for e in events)
    stages = sorted({e["stage"] for e in events})
    busy = {s: sum(e["end"] - e["start"] for e in events if e["stage"] == s) for s in stages}
    idle = [1 - busy[s] / (t1 - t0) for s in stages]
    return {"makespan": t1 - t0, "per_stage": idle, "mean": statistics.fmean(idle)}


def emulate(orders: list[list[Step]], stages: list[nn.Module], xs: list[torch.Tensor], ys: list[torch.Tensor]) -> float:
    """Run each stage's order in one process, step by step as `simulate` plays them; return the loss.

    The gradients land in the stages' .grad, as the p processes would leave them. ValueError for an
    order that skips or repeats a step, or that deadlocks.
    """
    p, m = len(stages), len(xs)
    for steps in orders:
        check_order(steps, m)
    events = simulate(p, m, order=lambda s, p_, m_: orders[s])
    sent, ins, outs, loss = {}, {}, {}, 0.0
    for e in sorted(events, key=lambda e: (e["start"], e["stage"])):
        s, i = e["stage"], e["mb"]
        if e["op"] == "F":
            inp = xs[i] if s == 0 else sent.pop(("F", s, i)).detach().requires_grad_()   # what stage s-1 sent
            out = stages[s](inp)
            if s == p - 1:
                out = F.mse_loss(out, ys[i]) / m
                loss += float(out.detach())
            else:
                sent[("F", s + 1, i)] = out
            ins[(s, i)], outs[(s, i)] = inp, out
        else:
            inp = ins.pop((s, i))
            outs.pop((s, i)).backward(None if s == p - 1 else sent.pop(("B", s, i)))
            if s > 0:
                sent[("B", s - 1, i)] = inp.grad
    return loss
