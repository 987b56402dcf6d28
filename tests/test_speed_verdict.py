"""Speed verdicts under noise (labkit.exercises.speed), with controlled timings: the same work gets the same points
however the load falls, a speed-up near a threshold is measured for more rounds, and untouched work scores 0."""
import random
from collections import Counter

import pytest

from labkit.exercises import speed
from labkit.exercises.ex13_capstone import MAX_ROUNDS, ROUNDS, THRESHOLDS

CPU = THRESHOLDS["cpu"]


def noisy(true: float, rng: random.Random, sigma: float = 0.04, burst: float = 0.15, second: float = 1.0):
    """pair(i, base_first) -> (baseline s, submission s): `true` times faster, each side jittered (log-normal,
    `sigma`), a neighbour's burst making one side of a pair 1.5x slower in `burst` of the rounds, and whichever
    runs second in a pair `second` times slower (warm caches or a scheduler that favours one position)."""
    def pair(i: int, base_first: bool) -> tuple[float, float]:
        b, m = rng.lognormvariate(0, sigma), rng.lognormvariate(0, sigma) / true
        if rng.random() < burst:
            b, m = (b * 1.5, m) if rng.random() < 0.5 else (b, m * 1.5)
        return (b, m * second) if base_first else (b * second, m)
    return pair


def grade(true: float, seed: int, **noise) -> speed.Verdict:
    pairs = speed.paired_rounds(noisy(true, random.Random(seed), **noise), CPU, ROUNDS, MAX_ROUNDS)
    return speed.verdict(speed.ratios_of([b for b, _ in pairs], [m for _, m in pairs]), CPU)


def test_the_interval_is_the_sign_tests():
    assert speed.median_interval([5, 1, 4, 2, 3]) == (2, 3, 4)  # n=5: one value left out each side (93.75%)
    assert speed.median_interval(list(range(15)))[::2] == (4, 10)  # n=15: four each side (94%)
    assert speed.median_interval([7.0]) == (7.0, 7.0, 7.0)
    with pytest.raises(ValueError):
        speed.median_interval([])


@pytest.mark.parametrize("true", [1.0, 1.45, 2.0, 2.6])
def test_the_same_work_gets_the_same_points_in_every_noisy_grading(true):
    """Speed-ups more than ~10% from every threshold (this noise's reach over 5-15 rounds)."""
    points = Counter(grade(true, seed).points for seed in range(150))
    assert points == {speed.points_for(true, CPU): 150}, points


def test_the_same_timings_always_give_the_same_verdict():
    assert len({grade(1.25, 7) for _ in range(5)}) == 1  # no random draws inside the verdict


def test_a_speedup_on_a_threshold_is_measured_longer_and_then_its_lower_bound_counts():
    near = [grade(1.75, seed) for seed in range(60)]
    far = [grade(1.45, seed) for seed in range(60)]
    assert sum(v.rounds for v in near) > 1.5 * sum(v.rounds for v in far)
    assert any(v.rounds == MAX_ROUNDS for v in near) and all(v.rounds >= ROUNDS for v in near + far)
    for v in near:
        assert v.points == speed.points_for(v.low, CPU) and (v.settled or v.rounds == MAX_ROUNDS)


@pytest.mark.parametrize("noise", [dict(sigma=0.1), dict(sigma=0.05, burst=0.4), dict(sigma=0.04, second=1.19)])
def test_untouched_work_scores_zero_under_any_load(noise):
    """The baseline against itself: jitter, frequent bursts, or a 19% edge for whichever runs second."""
    points = Counter(grade(1.0, seed, **noise).points for seed in range(150))
    assert points == {0: 150}, points
    assert CPU[0][0] > 1.1 and THRESHOLDS["cuda"][0][0] > 1.1  # the first point sits above the baseline's noise


def test_the_solution_sits_clear_of_every_threshold_where_it_was_measured():
    """Identical work graded twice gets the same points unless its speed-up lies within the noise of a threshold:
    the course's own solution must not (each GPU's measured intervals at least 10% from every threshold)."""
    from labkit.exercises import ex13_capstone as ex13

    for kind, measured in ex13.SOLUTION_SPEEDUPS.items():
        for gpu, (low, high) in measured.items():
            near = [s for s, _ in ex13.THRESHOLDS[kind] if low / 1.1 < s < high * 1.1]
            assert not near, f"{gpu}: the solution's {low}-{high}x lies within 10% of threshold(s) {near}"


def test_a_right_median_on_a_loaded_machine_passes_and_a_wrong_one_fails(monkeypatch):
    """Exercise 03 on a machine so loaded that every sleep runs 4x long plus 5 ms: the grader measures again, then
    grades against its own measurement of the same calls (its clock and sleep bound before student code)."""
    import statistics

    from fake_clock import FakeClock
    from labkit.exercises import ex03_timing as ex03

    clock = FakeClock()
    monkeypatch.setattr(ex03, "_PERF", clock.perf_counter)
    monkeypatch.setattr(ex03, "_NAP", lambda s: clock.sleep(4 * s + 5e-3))

    def right(fn, device, warmup, reps):
        for _ in range(warmup):
            fn()
        took = []
        for _ in range(reps):
            t0 = clock.perf_counter()
            fn()
            took.append((clock.perf_counter() - t0) * 1e3)
        return statistics.median(took)

    def mean(fn, device, warmup, reps):  # the outlier counted
        for _ in range(warmup):
            fn()
        t0 = clock.perf_counter()
        for _ in range(reps):
            fn()
        return (clock.perf_counter() - t0) * 1e3 / reps

    case = ex03.median_ms_case("loaded", "cpu", [3.0, 40.0], 2, 5, 3)
    for fn, ok in ((right, True), (mean, False), (lambda fn, device, warmup, reps: 3.0, False)):
        got = ex03.call_median_ms(fn, case["args"])
        problems = ex03.compare_median(case["expected"], got, case["rtol"], case["atol"])
        assert (problems == []) == ok, (fn, problems)
    assert len(clock.slept) == 2 * ex03.ATTEMPTS * 2 * (2 + 5)  # two of them call fn: measured again, ATTEMPTS times


def test_a_served_run_whose_calls_the_pipes_slowed_is_measured_again():
    """Served (exercise 03 graded), the student's clock sees each call's trip through the pipes too, which a loaded
    machine stretches: a run whose span of a call is over what SPAN_OVER_SLEEP counts is measured again (as one whose
    sleeps ran long is), so that an honest median is not graded against a span the cap cut short."""
    from labkit.exercises import ex03_timing as ex03

    load = ex03.Workload("cpu", 2.0, warmup=1, reps=3, outlier_at=0)
    load.took = [20.0, 20.0, 2.1, 2.1]  # the warm-up call and timed call 0 are 10x: the grader's median is 2.1
    for trip_ms, again in ((0.2, False), (0.7, False), (2.0, True)):  # the cap here: 1.25 x 2.1 + 1 = 3.6 ms
        gap = 2.1e-3 + trip_ms / 1e3  # from one ask to the next: the sleep and the trip between answer and ask
        load.opened, load.asked = -trip_ms / 1e3, [i * gap for i in range(4)]
        load.answered = [t + 2.1e-3 for t in load.asked]
        assert load.span() == pytest.approx(2.1 + 2 * trip_ms) and load.retry() == again, trip_ms  # the trip twice
    load.took[2:] = [1.0, 1.0]  # under the sleep: the grader's own measurement is implausible
    assert load.retry()
    assert not ex03.Workload("cuda", 2.0, warmup=1, reps=3, outlier_at=0).retry()  # a GPU sleep is told, not served
