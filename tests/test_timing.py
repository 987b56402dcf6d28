"""labkit.timing: its statistics, and how bench samples, on a fake clock where durations are exact (speed itself is
measured by `labkit bench`, not here)."""
import pytest
import torch

from fake_clock import FakeClock
from labkit import timing
from labkit.timing import Timing, bench, gbps, summarize, tflops


@pytest.fixture
def clock(monkeypatch):
    """labkit.timing's clock, moved only by the functions a test times."""
    c = FakeClock()
    monkeypatch.setattr(timing, "time", c)
    return c


def test_summary_statistics():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert t.median_ms == 3.0 and t.n == 5
    assert t.p20_ms == pytest.approx(1.8) and t.p80_ms == pytest.approx(4.2)
    assert t.spread == pytest.approx((4.2 - 1.8) / 3.0)
    assert "n=5" in str(t)


def test_no_samples_is_an_error():
    with pytest.raises(ValueError):
        summarize([])


def test_bench_counts_every_call_and_orders_quantiles():
    calls = []
    t = bench(lambda: calls.append(1), warmup_ms=1, rep_ms=5, min_reps=7, device="cpu")
    assert isinstance(t, Timing)
    assert t.n >= 7 and len(t.samples) == t.n
    assert len(calls) > t.n  # warm-up calls are not sampled
    assert t.p20_ms <= t.median_ms <= t.p80_ms


def test_bench_times_each_call_and_nothing_else(clock):
    t = bench(lambda: clock.advance(0.002), warmup_ms=1, rep_ms=20, min_reps=5, device="cpu")
    assert t.n >= 5 and t.samples == pytest.approx([2.0] * t.n)  # every sample is one call, in ms
    assert t.median_ms == t.p20_ms == t.p80_ms == pytest.approx(2.0)


def test_bench_measures_real_work_on_cpu():
    import time

    # on the real clock: a sleep never ends early, so the median cannot be below it (how far above is the machine's)
    t = bench(lambda: time.sleep(0.002), warmup_ms=1, rep_ms=20, min_reps=5, device="cpu")
    assert t.median_ms >= 1.999 and t.n >= 5


def test_max_reps_caps_the_sample_count(clock):
    t = bench(lambda: clock.advance(1e-6), warmup_ms=1, rep_ms=1000, max_reps=20, device="cpu")
    assert t.n == 20


def test_cuda_graph_needs_a_gpu():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        bench(lambda: None, cuda_graph=True, device="cpu")


def test_units():
    assert gbps(2e9, 1000.0) == pytest.approx(2.0)
    assert tflops(3e12, 1000.0) == pytest.approx(3.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_events_time_the_kernel_not_the_launch():
    x = torch.randn(1 << 26, device="cuda")
    t = bench(lambda: x.mul_(1.0), device="cuda")
    # 2 x 256 MiB moved: well over 20 us on any GPU, while a launch alone is a few us
    assert t.median_ms > 0.02
    g = bench(lambda: x.add_(0.0), cuda_graph=True, device="cuda")
    assert g.median_ms > 0.02


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_call_a_graph_cannot_capture_raises_and_leaves_random_ops_working():
    x = torch.randn(1024, device="cuda")
    with pytest.raises(RuntimeError):  # a sync inside the capture: CUDA itself fails the capture
        bench(lambda: (x.add_(1.0), torch.cuda.synchronize()), cuda_graph=True, device="cuda")
    # After such a capture, torch's CUDA random generator stays marked as capturing (seen with torch 2.11)
    # unless the timing clears it: then the next random op fails.
    assert torch.randn(8, device="cuda").isfinite().all()
    assert bench(lambda: x.add_(0.0), cuda_graph=True, device="cuda").median_ms > 0


def test_host_sampling_stops_near_its_budget_when_calls_slow_down(clock):
    calls = {"n": 0}

    def fn():  # instant while the count is estimated, then 5 ms: a loaded machine
        calls["n"] += 1
        if calls["n"] > 3:
            clock.advance(0.005)

    start = clock.now
    t = bench(fn, warmup_ms=10, rep_ms=50, min_reps=5, device="cpu")
    # the estimate asked for 10,000 calls (50 s); bench stops at twice its budgets, plus the calls that straddle them
    assert clock.now - start <= (10 + 2 * 50 + 3 * 5) / 1e3 + 1e-6 and calls["n"] < 40
    assert t.n >= 5 and t.median_ms == pytest.approx(5.0)


def test_a_slow_call_is_capped_and_says_so(clock, capsys):
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        clock.advance(0.3)

    start = clock.now
    t = bench(fn, rep_ms=100, min_reps=5, max_s=1.0, device="cpu")
    assert clock.now - start <= 1.0 + 0.3 + 1e-9  # max_s, and the first (warm-up) call: 8 calls (2.4 s) uncapped
    assert t.n >= 1 and calls["n"] == t.n + 1 and t.median_ms == pytest.approx(300.0)
    assert "one call takes" in capsys.readouterr().out


def test_a_slow_first_call_alone_is_warm_up_not_the_measurement(clock, capsys):
    """A first call that compiles or autotunes must not decide how (or what) bench times."""
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        clock.advance(0.5 if calls["n"] == 1 else 0.001)

    t = bench(fn, warmup_ms=5, rep_ms=50, min_reps=5, device="cpu")
    assert t.n >= 5 and max(t.samples) == pytest.approx(1.0) and t.median_ms == pytest.approx(1.0)
    assert "one call takes" not in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_bench_on_cuda_without_a_gpu_says_what_to_do():
    with pytest.raises(RuntimeError, match="no CUDA GPU.*device='cpu'"):
        bench(lambda: None, device="cuda")


def test_interleaved_rounds_spread_a_slowdown_over_every_call(clock):
    """A machine that slows down half-way must not make the call timed second look slower (bench_interleaved)."""
    start = clock.now

    def at(ms):  # the call costs `ms`, twice that after the first 0.6 s of the run
        return lambda: clock.advance(ms / 1e3 * (2 if clock.now - start > 0.6 else 1))

    one_after_other = {"a": bench(at(1.0), warmup_ms=1, rep_ms=500, device="cpu"),
                       "b": bench(at(1.0), warmup_ms=1, rep_ms=500, device="cpu")}
    assert one_after_other["b"].median_ms > 1.5 * one_after_other["a"].median_ms  # the trap: b took the slowdown
    start = clock.now
    both = timing.bench_interleaved({"a": at(1.0), "b": at(1.0)}, rounds=6, rep_ms=1000, warmup_ms=1, device="cpu")
    assert set(both) == {"a", "b"} and both["a"].n > 100
    assert both["a"].median_ms == pytest.approx(both["b"].median_ms, rel=0.35)
    assert sum(s > 1.5 for s in both["a"].samples) > 0 and sum(s > 1.5 for s in both["b"].samples) > 0


def test_interleaved_needs_calls_and_rounds():
    with pytest.raises(ValueError, match="at least one call"):
        timing.bench_interleaved({})
    with pytest.raises(ValueError, match="at least 1 round"):
        timing.bench_interleaved({"a": lambda: None}, rounds=0)


def test_bench_each_alternates_on_a_cpu_and_times_blocks_on_a_gpu(clock, monkeypatch):
    """bench_each: a CPU's slowdown half-way falls on every call alike; a GPU keeps one block per call."""
    start = clock.now

    def at(ms):  # the call costs `ms`, twice that after the first 0.6 s of the run
        return lambda: clock.advance(ms / 1e3 * (2 if clock.now - start > 0.6 else 1))

    both = timing.bench_each({("a", 1): at(1.0), ("b", 2): at(1.0)}, rounds=6, rep_ms=1000, warmup_ms=1, device="cpu")
    assert set(both) == {("a", 1), ("b", 2)}
    assert both[("a", 1)].median_ms == pytest.approx(both[("b", 2)].median_ms, rel=0.35)
    start = clock.now
    blocks = timing.bench_each({"a": at(1.0), "b": at(1.0)}, interleave=False, warmup_ms=1, rep_ms=500, device="cpu")
    assert blocks["b"].median_ms > 1.5 * blocks["a"].median_ms  # one block each: b took the whole slowdown
    called = []
    monkeypatch.setattr(timing, "bench", lambda fn, **kw: called.append(("bench", kw["device"])) or "t")
    monkeypatch.setattr(timing, "bench_interleaved", lambda fns, **kw: called.append(("interleaved", kw["device"])))
    assert timing.bench_each({"a": None, "b": None}, device="cuda") == {"a": "t", "b": "t"}
    timing.bench_each({"a": None}, device="cpu")
    assert called == [("bench", "cuda"), ("bench", "cuda"), ("interleaved", "cpu")]
