"""Speed verdicts that do not move with the machine's load: paired rounds, a confidence interval, more rounds near
a threshold. Used by: the graded speed-ups of exercises 11 and 13 (labkit.exercises.ex11_profiling, ex13_capstone).

Each round times the baseline and the submission back to back on the same fresh inputs (the order alternating),
so a load that comes and goes slows both sides of a pair alike; the verdict is about the ratio of each pair.
The interval is the distribution-free one for the median of the ratios (a sign test: order statistics picked by
the binomial distribution), so it needs no model of the noise and no random draws: the same timings always give
the same verdict. While a threshold lies inside the interval, more rounds are timed, up to a budget; then the
interval's lower bound decides. The same work therefore gets the same points unless its true speed-up lies within
the measured noise of a threshold, and then it gets the points below that threshold.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

CONFIDENCE = 0.9  # two-sided: the lower bound is a one-sided 95% bound
STOP_CONFIDENCE = 0.98  # the interval that must clear every threshold before the rounds stop early


def points_for(speedup: float, thresholds) -> int:
    """The points of the highest threshold `speedup` reaches (0 below the first)."""
    return max([p for s, p in thresholds if speedup >= s], default=0)


def median_interval(ratios: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, median, high): the sign-test interval for the median of `ratios` (the widest one, [min, max], when
    there are too few of them for `confidence`)."""
    xs = sorted(float(r) for r in ratios)
    n = len(xs)
    if n == 0:
        raise ValueError("no rounds measured")
    alpha, k, tail = 1 - confidence, 0, 0.0  # k: how many values each side the interval may leave out
    while k < n // 2:
        tail += math.comb(n, k) / 2**n  # P(Binomial(n, 1/2) <= k)
        if 2 * tail > alpha:
            break
        k += 1
    mid = (xs[(n - 1) // 2] + xs[n // 2]) / 2
    return xs[k], mid, xs[n - 1 - k]


@dataclass(frozen=True)
class Verdict:
    points: int
    low: float
    median: float
    high: float
    rounds: int
    settled: bool  # the whole interval earns the same points

    def describe(self, what: str = "the baseline") -> str:
        how = ("" if self.settled else
               f"; the interval still straddles a threshold after {self.rounds} rounds, so its lower bound counts")
        return (f"{self.median:.2f}x {what} (median of {self.rounds} paired rounds; {CONFIDENCE:.0%} interval "
                f"{self.low:.2f}-{self.high:.2f}x{how})")


def verdict(ratios: list[float], thresholds, confidence: float = CONFIDENCE) -> Verdict:
    """Points for the paired speed-ups `ratios`: those of the whole interval when it earns one number of points,
    else those of its lower bound."""
    low, mid, high = median_interval(ratios, confidence)
    lo_pts, hi_pts = points_for(low, thresholds), points_for(high, thresholds)
    return Verdict(lo_pts, low, mid, high, len(ratios), lo_pts == hi_pts)


def settled(ratios: list[float], thresholds, min_rounds: int, max_rounds: int) -> bool:
    """Enough rounds: `max_rounds`, or at least `min_rounds`, as many with the baseline first as second (an edge for
    whichever side runs second cancels), and the STOP_CONFIDENCE interval clear of every threshold (stricter than
    the verdict's: looking after every round would otherwise stop on a lucky run of rounds)."""
    n = len(ratios)
    if n >= max_rounds:
        return True
    return n >= min_rounds and n % 2 == 0 and verdict(ratios, thresholds, STOP_CONFIDENCE).settled


def paired_rounds(pair: Callable[[int, bool], tuple[float, float]], thresholds, min_rounds: int,
                  max_rounds: int) -> list[tuple[float, float]]:
    """Call pair(i, baseline_first) -> (baseline seconds, submission seconds) for round 0 (the warm-up, not
    counted) and timed rounds 1, 2, ... until `settled`; the order inside a pair alternates. All the pairs."""
    pairs = [pair(0, True)]
    while True:
        timed = [b / m for b, m in pairs[1:]]
        if timed and settled(timed, thresholds, min_rounds, max_rounds):
            return pairs
        i = len(pairs)
        pairs.append(pair(i, i % 2 == 0))


def ratios_of(base_s: list[float], mine_s: list[float]) -> list[float]:
    """The speed-up of each timed pair (the warm-up pair, the first, left out when there are others)."""
    pairs = list(zip(base_s, mine_s))
    pairs = pairs[1:] or pairs
    return [b / m for b, m in pairs]
