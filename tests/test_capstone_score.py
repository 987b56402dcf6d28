"""Scoring the capstone: speed-up thresholds, and zero for a loop that skips work or caches its outputs."""
import dataclasses

import pytest
import torch

from labkit.capstone import Measured, RunConfig, Trainer, GPTConfig, make_corpus, score, variant
from labkit.capstone.score import THRESHOLDS, points_for
from labkit.capstone.train import measure

SEQ, WINDOWS = 16, 16
VOCAB = make_corpus(WINDOWS, SEQ).vocab
RUN = RunConfig(GPTConfig(vocab=VOCAB, seq=SEQ, d_model=32, heads=2, layers=1), batch=4, steps=10, windows=WINDOWS,
                time_steps=2, rep_ms=20)
CURVE = tuple(3.8 - 0.1 * i for i in range(10))
BASE = Measured(tokens_per_s=1000.0, losses=CURVE, eval_loss=3.0, warmup_s=1.0)


def test_points_follow_the_thresholds():
    assert points_for(1.0) == 0 and points_for(THRESHOLDS[0][0]) == THRESHOLDS[0][1]
    assert points_for(1e6) == max(p for _, p in THRESHOLDS)
    s = score(dataclasses.replace(BASE, tokens_per_s=3500.0), BASE)
    assert s.ok and s.points == points_for(3.5) > 0 and s.speedup == pytest.approx(3.5)


@pytest.mark.parametrize("change, why", [
    (dict(losses=CURVE[:-1] + (CURVE[-1] * 1.05,)), "wrong loss"),
    (dict(losses=CURVE[:5]), "losses for"),
    (dict(losses=CURVE[:4] + (CURVE[4] * 1.2,) + CURVE[5:]), "curve"),
    (dict(eval_loss=3.8), "cached or made up"),
    (dict(output_rel=0.9), "not trained from this start"),
    (dict(warmup_s=1e4), "budget"),
    (dict(eval_loss=float("nan")), "finite"),
])
def test_wrong_results_score_zero_however_fast(change, why):
    s = score(dataclasses.replace(BASE, tokens_per_s=1e9, **change), BASE)
    assert s.points == 0 and not s.ok and why in s.reason


class SkipsWork(Trainer):
    """Fast by cheating: every other step runs the forward only (no backward, no update)."""

    def step(self):
        if self.i % 2:
            x, y = self.next_batch()
            with torch.no_grad():
                self.loss_buf[self.i % self.run.steps].copy_(self.forward(x, y))
            self.i += 1
        else:
            super().step()


class CachesOutputs:
    """Fast by cheating: replays losses recorded in an earlier run and trains nothing (optionally
    loading weights trained on that run's inputs too)."""

    def __init__(self, recorded, model):
        self.recorded, self.model, self.i = list(recorded), model, 0

    def step(self):
        self.i += 1

    def losses(self):
        return self.recorded[: RUN.steps]


def honest(run, corpus, device):
    return Trainer(variant("device_data"), run, corpus, device)


@pytest.fixture(scope="module")
def base_and_model():
    kept = []
    m = measure(lambda run, corpus, device: Trainer(variant("baseline"), run, corpus, device), RUN, "cpu", keep=kept)
    return m, kept[0]


@pytest.fixture(scope="module")
def base(base_and_model):
    return base_and_model[0]


def graded(make, base_and_model):
    return score(measure(make, RUN, "cpu", reference=base_and_model[1]), base_and_model[0])


@pytest.mark.parametrize("name", ["device_data", "bf16"])
def test_an_honest_faster_loop_passes_the_checks(name, base_and_model):
    s = graded(lambda r, c, d: Trainer(variant(name), r, c, d), base_and_model)
    assert s.ok, s.reason
    assert s.checks["output_rel"] < (1e-5 if name == "device_data" else 0.05)


def test_skipping_work_scores_zero(base_and_model):
    s = graded(lambda r, c, d: SkipsWork(variant("device_data"), r, c, d), base_and_model)
    assert s.points == 0 and not s.ok, s


def test_cached_losses_without_training_score_zero(base_and_model):
    fresh = Trainer(variant("device_data"), RUN, make_corpus(WINDOWS, SEQ), "cpu").model
    s = graded(lambda r, c, d: CachesOutputs(base_and_model[0].losses, fresh), base_and_model)
    assert s.points == 0 and "cached" in s.reason, s


def test_outputs_cached_from_other_inputs_score_zero(base_and_model):
    other = dataclasses.replace(RUN, seed=RUN.seed + 7)  # the visible case; the grader's seed differs
    t = honest(other, make_corpus(WINDOWS, SEQ, other.seed), "cpu")
    for _ in range(RUN.steps):
        t.step()
    s = graded(lambda r, c, d: CachesOutputs(t.losses(), t.model), base_and_model)
    assert s.points == 0 and "not trained from this start" in s.reason, s
