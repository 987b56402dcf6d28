"""Points for a measured training loop: speed-up over the baseline, but only if it trained the same model.

`score` is a pure function of what the grader measured. It gives zero when the warm-up (compilation)
ran over budget, when the loss after N steps is off the baseline's by more than the tolerance, when
the per-step losses do not follow the baseline's curve (work skipped on some steps), or when the
grader's own evaluation of the trained weights disagrees with the baseline's (outputs cached or made
up rather than computed), or when the trained model's outputs on held-out text are not the baseline
model's (weights trained on other inputs: a good model, but not the one these inputs make).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# speed-up over the baseline -> points (the highest threshold reached counts)
THRESHOLDS: tuple[tuple[float, int], ...] = ((1.5, 1), (3.0, 2), (6.0, 3), (12.0, 4), (24.0, 5))
LOSS_RTOL = 0.01       # loss after N steps, relative to the baseline's (train.LOW_RTOL: bf16 stays inside it)
CURVE_RTOL = 0.03      # each checked step's loss, relative (single steps wander more than the mean)
EVAL_RTOL = 0.01       # the grader's evaluation of the trained weights vs the baseline's
OUTPUT_RTOL = 0.25     # the trained model's logits vs the baseline model's (relative L2), same held-out text
WARMUP_BUDGET_S = 120.0


@dataclass(frozen=True)
class Measured:
    """What the grader measured for one training loop on its own inputs."""

    tokens_per_s: float
    losses: tuple[float, ...]        # the loss of each of the N steps, as the loop reported it
    eval_loss: float                 # the grader's own loss of the trained weights on held-out windows
    warmup_s: float = 0.0            # first step: compilation, autotuning
    output_rel: float = 0.0          # relative L2 distance of its logits from the baseline model's, held-out text


@dataclass(frozen=True)
class Score:
    points: int
    speedup: float
    ok: bool
    reason: str
    checks: dict = field(default_factory=dict)


def final(losses: tuple[float, ...] | list[float]) -> float:
    """The loss after N steps: the mean over the last tenth of them (the same rule as train.final_loss)."""
    k = max(1, len(losses) // 10)
    return sum(losses[-k:]) / k


def points_for(speedup: float, thresholds=THRESHOLDS) -> int:
    return max([p for s, p in thresholds if speedup >= s], default=0)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def score(m: Measured, baseline: Measured, loss_rtol: float = LOSS_RTOL, curve_rtol: float = CURVE_RTOL,
          eval_rtol: float = EVAL_RTOL, output_rtol: float = OUTPUT_RTOL, warmup_budget_s: float = WARMUP_BUDGET_S,
          thresholds=THRESHOLDS) -> Score:
    """Points for `m` against the baseline loop measured on the same inputs (zero, with the reason, if wrong)."""
    speedup = m.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s > 0 else 0.0
    n = len(baseline.losses)
    checks = {"speedup": speedup, "warmup_s": m.warmup_s}

    def zero(reason: str) -> Score:
        return Score(0, speedup, False, reason, checks)

    if len(m.losses) != n:
        return zero(f"reported {len(m.losses)} losses for {n} steps: every step must train and report its loss")
    if not all(math.isfinite(x) for x in (*m.losses, m.eval_loss, m.output_rel, m.tokens_per_s)):
        return zero("a loss or the speed is not a finite number")
    if m.warmup_s > warmup_budget_s:
        return zero(f"warm-up took {m.warmup_s:.0f} s, over the {warmup_budget_s:.0f} s budget")
    checks["loss_rel"] = _rel(final(m.losses), final(baseline.losses))
    if checks["loss_rel"] > loss_rtol:
        return zero(f"wrong loss: {final(m.losses):.4f} after {n} steps vs the baseline's "
                    f"{final(baseline.losses):.4f} (tolerance {loss_rtol:.0%}); a faster loop must train the "
                    "same model")
    # every tenth step along the curve: a loop that skips work on some steps, or replays another run's
    # losses, drifts off the baseline's curve even when the end lands close
    picks = sorted(set(range(0, n, max(1, n // 10))) | {n - 1})
    checks["curve_rel"] = max(_rel(m.losses[i], baseline.losses[i]) for i in picks)
    if checks["curve_rel"] > curve_rtol:
        return zero(f"the loss curve leaves the baseline's (worst step {checks['curve_rel']:.1%} off, tolerance "
                    f"{curve_rtol:.0%}): steps skipped work, or losses were not computed on these inputs")
    checks["eval_rel"] = _rel(m.eval_loss, baseline.eval_loss)
    if checks["eval_rel"] > eval_rtol:
        return zero(f"the trained weights score {m.eval_loss:.4f} on held-out text, the baseline's "
                    f"{baseline.eval_loss:.4f}: the reported losses were cached or made up, not trained")
    checks["output_rel"] = m.output_rel
    if m.output_rel > output_rtol:
        return zero(f"the trained model's outputs are {m.output_rel:.0%} away from the baseline model's (tolerance "
                    f"{output_rtol:.0%}): these weights were not trained from this start on these inputs")
    if m.tokens_per_s <= 0:
        return zero("no speed measured")
    pts = points_for(speedup, thresholds)
    return Score(pts, speedup, True, f"{speedup:.2f}x the baseline: {pts} point(s)", checks)
