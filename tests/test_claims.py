import json

import numpy as np
import pytest

from labkit import claims, stats
from labkit.timing import summarize


@pytest.fixture(autouse=True)
def _quiet_host(monkeypatch):
    """These tests decide verdicts from given figures: the host's load is not part of them."""
    monkeypatch.setattr(claims, "_host_busy", lambda: None)
    monkeypatch.delenv("LABKIT_CLAIMS_INVERT", raising=False)
    monkeypatch.delenv("LABKIT_CLAIMS_STRICT", raising=False)


def slow_link(holds: bool) -> claims.Diagnosis:
    return claims.diagnosis("slow_link", "the link is slower than the copy", holds=holds,
                            figures={"link": (8.0, "GB/s")})


def test_a_claim_that_holds_prints_expected_measured_and_verdict(capsys):
    entry = claims.claim("pinned_faster", "pinned copies beat pageable ones", holds=True,
                         figures={"pinned": (55.1, "GB/s"), "pageable": (8.5, "GB/s")},
                         because="pinned pages go straight to the DMA engine")
    out = capsys.readouterr().out
    assert "[HOLDS] pinned_faster: expected pinned copies beat pageable ones" in out
    assert "pinned 55.1 GB/s, pageable 8.5 GB/s" in out and "DMA engine" in out
    assert entry["status"] == "held" and claims.claims["pinned_faster"] is entry
    json.dumps(entry)  # batch runs store it as data


def test_a_miss_differs_only_when_a_diagnosis_measured_here_holds(capsys):
    entry = claims.claim("gpu_wins", "the GPU beats the CPU", holds=False, figures={"speed-up": (3.0, "x")},
                         diagnoses=[slow_link(False), claims.diagnosis("tiny", "quick sizes are too small to fill it",
                                                                       holds=True, figures={"n": 64})])
    out = capsys.readouterr().out
    assert entry["status"] == "differs" and "DIFFERS" in out
    assert "tiny: quick sizes are too small to fill it (n 64)" in out and "slow_link" not in entry["note"]
    assert [d["holds"] for d in entry["diagnoses"]] == [False, True]  # every diagnosis is recorded, held or not


def test_a_miss_no_diagnosis_explains_is_a_failure_listing_what_was_checked(capsys):
    entry = claims.claim("gpu_wins", "the GPU beats the CPU", holds=False, diagnoses=[slow_link(False)])
    assert entry["status"] == "failed" and "[FAILED]" in capsys.readouterr().out
    assert "no diagnosis holds here" in entry["note"] and "slow_link" in entry["note"]
    assert claims.claim("x", "something", holds=False)["status"] == "failed"


def test_free_text_excuses_are_refused():
    with pytest.raises(TypeError, match="otherwise= .* is gone"):
        claims.claim("x", "something", holds=False, otherwise="this machine is odd")
    with pytest.raises(TypeError, match="labkit.diagnosis"):
        claims.claim("x", "something", holds=False, diagnoses=["this machine is odd"])


def test_a_skipped_claim_says_what_it_needs(capsys):
    entry = claims.skip("nvlink", "two GPUs talk over NVLink", needs="2 CUDA GPUs")
    assert entry["status"] == "skipped" and "needs: 2 CUDA GPUs" in capsys.readouterr().out


def test_sampled_figures_decide_by_resampling_and_record_their_spread():
    fast, slow = summarize([1.0, 1.01, 0.99, 1.02, 0.98] * 4), summarize([2.0, 2.02, 1.98, 2.01, 1.99] * 4)
    entry = claims.claim("twice", "slow takes 1.5x fast", lambda f: f["slow"] > 1.5 * f["fast"],
                         figures={"fast": (fast, "ms"), "slow": (slow, "ms")})
    assert entry["status"] == "held" and entry["agreement"] == 1.0
    assert entry["figures"]["fast"]["n"] == 20 and entry["figures"]["fast"]["p20"] < entry["figures"]["fast"]["p80"]


def test_a_spread_that_straddles_the_threshold_is_inconclusive_not_explained(capsys):
    a = summarize([1.0, 3.0, 1.2, 2.8, 1.5, 2.5, 1.1, 2.9, 2.0, 1.9])
    b = summarize([2.0, 1.0, 2.9, 1.3, 2.6, 1.4, 2.2, 1.8, 2.1, 1.6])
    entry = claims.claim("a_slower", "a is slower than b", lambda f: f["a"] > f["b"],
                         figures={"a": (a, "ms"), "b": (b, "ms")}, diagnoses=[slow_link(True)])
    assert entry["status"] == "inconclusive" and "rerun on a quiet machine" in entry["note"]
    assert "slow_link" not in entry["note"] and "INCONCLUSIVE" in capsys.readouterr().out


def test_a_median_that_rests_on_one_slow_spell_is_inconclusive():
    """Samples taken in slow and fast spells are drawn in runs: 55% slow in two spells cannot decide what 55% slow
    samples scattered one by one decide."""
    a = [1.0] * 225 + [2.0] * 275 + [1.0] * 225 + [2.0] * 275  # median 2.0, on the spells
    b = [1.0] * 275 + [2.0] * 225 + [1.0] * 275 + [2.0] * 225  # median 1.0
    test = lambda f: f["a"] > 1.5 * f["b"]  # noqa: E731
    spells = claims.claim("spells", "a is 1.5x b", test, figures={"a": summarize(a), "b": summarize(b)})
    assert spells["status"] == "inconclusive" and spells["agreement"] < 0.7
    order = np.random.default_rng(0).permutation(len(a))
    scattered = claims.claim("scattered", "a is 1.5x b", test,
                             figures={"a": summarize(list(np.take(a, order))), "b": summarize(list(np.take(b, order)))})
    assert scattered["status"] == "held" and scattered["agreement"] >= 0.95


def test_too_few_samples_are_inconclusive():
    entry = claims.claim("two", "a is slower than b", lambda f: f["a"] > f["b"],
                         figures={"a": summarize([2.0, 2.1]), "b": summarize([1.0, 1.1, 1.0, 1.1, 1.0])})
    assert entry["status"] == "inconclusive" and "too few samples" in entry["note"]


def test_a_timed_miss_on_a_busy_host_is_inconclusive_and_names_the_load(monkeypatch):
    monkeypatch.setattr(claims, "_host_busy", lambda: 0.6)
    fast = summarize([1.0] * 10)
    entry = claims.claim("t", "fast takes over 2 ms", lambda f: f["fast"] > 2, figures={"fast": fast},
                         diagnoses=[slow_link(True)])
    assert entry["status"] == "inconclusive" and "other processes used 60%" in entry["note"]
    # an untimed claim is not excused by load: its figures are not noisy
    assert claims.claim("u", "over 2", holds=False, figures={"x": 1.0})["status"] == "failed"


def test_a_miss_on_counts_alone_is_a_failure_however_busy_the_host(monkeypatch):
    """Load slows clocks, not counts: a claim decided by counted samples (launches per step) that misses FAILED on a
    busy host; one with a timed figure beside them is INCONCLUSIVE there."""
    monkeypatch.setattr(claims, "_host_busy", lambda: 0.6)
    launches = stats.Samples.of([300, 301, 300, 299, 300, 300], counted=True)
    assert launches.map(lambda v: v / 2).counted  # a count in other units is still a count
    few = claims.claim("few", "under 100 launches", lambda f: f["launches"] < 100, figures={"launches": launches})
    assert few["status"] == "failed" and "busy" not in few["note"]
    mixed = claims.claim("mixed", "under 100 launches in under 1 ms", lambda f: f["launches"] < 100 and f["ms"] < 1,
                         figures={"launches": launches, "ms": summarize([2.0] * 10)})
    assert mixed["status"] == "inconclusive" and "other processes used 60%" in mixed["note"]


def test_inversion_turns_every_decided_claim_around(monkeypatch):
    monkeypatch.setenv("LABKIT_CLAIMS_INVERT", "1")
    assert claims.claim("a", "holds", holds=True)["status"] == "failed"
    assert claims.claim("b", "holds", holds=True, diagnoses=[slow_link(True)])["status"] == "differs"
    t = summarize([1.0] * 10)
    assert claims.claim("c", "t < 2", lambda f: f["t"] < 2, figures={"t": t})["status"] == "failed"
    assert claims.claim("d", "t > 2", lambda f: f["t"] > 2, figures={"t": t})["status"] == "held"


def _cases():
    """Claims of every kind of verdict, as (name, kwargs) (their figures are given, not measured)."""
    steady, noisy = summarize([1.0] * 10), summarize([1.0, 3.0] * 6)
    return [("held", dict(holds=True)), ("missed", dict(holds=False)),
            ("rescued", dict(holds=True, diagnoses=[slow_link(True)])),
            ("unrescued", dict(holds=True, diagnoses=[slow_link(False)])),
            ("timed", dict(holds=lambda f: f["t"] < 2, figures={"t": steady})),
            ("timed_miss", dict(holds=lambda f: f["t"] > 2, figures={"t": steady}, diagnoses=[slow_link(True)])),
            ("straddles", dict(holds=lambda f: f["t"] < 2, figures={"t": noisy})),
            ("few", dict(holds=lambda f: f["t"] < 2, figures={"t": summarize([1.0] * 3)})),
            ("skipped", dict(holds=None, needs="a GPU"))]


@pytest.mark.parametrize("busy", [None, 0.6])
def test_the_logged_inverted_verdict_is_the_inverted_runs_own(monkeypatch, tmp_path, busy):
    """LABKIT_CLAIMS_LOG logs, beside each verdict, the one LABKIT_CLAIMS_INVERT=1 gives the same figures, so one run
    of the notebooks answers whether each claim can fail (tests/test_claims_can_fail.py)."""
    monkeypatch.setattr(claims, "_host_busy", lambda: busy)
    monkeypatch.setenv("LABKIT_CLAIMS_LOG", str(tmp_path))
    monkeypatch.setenv("LABKIT_NOTEBOOK", "/course/notebooks/02_x.ipynb")
    normal = {name: claims.claim(name, "expected", **kw) for name, kw in _cases()}
    logged = [json.loads(line) for f in tmp_path.glob("claims-*.jsonl") for line in f.read_text().splitlines()]
    assert {r["notebook"] for r in logged} == {"/course/notebooks/02_x.ipynb"}
    logged = {r["claim"]["name"]: r["claim"] for r in logged}
    monkeypatch.delenv("LABKIT_CLAIMS_LOG")
    monkeypatch.setenv("LABKIT_CLAIMS_INVERT", "1")
    for name, kw in _cases():
        run = claims.claim(name, "expected", **kw)
        assert (logged[name]["status"], logged[name]["note"]) == (run["status"], run["note"]), name
        assert logged[name]["inverted"] and logged[name].get("uninverted") == run.get("uninverted"), name
        assert normal[name]["status"] != "held" or run["status"] != "held", name  # (what the log is for)
    assert list(tmp_path.glob("*")) == [tmp_path / next(tmp_path.glob("claims-*.jsonl")).name]  # nothing more


def test_strict_mode_raises_after_printing_a_failed_claim(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_CLAIMS_STRICT", "1")
    assert claims.claim("ok", "holds", holds=True)["status"] == "held"
    with pytest.raises(claims.ClaimFailed, match="claim 'bad' failed"):
        claims.claim("bad", "holds", holds=False)
    assert "[FAILED] bad" in capsys.readouterr().out


def test_numpy_and_tensor_verdicts_and_figures_are_accepted():
    import numpy as np
    import torch
    entry = claims.claim("np", "numbers", holds=np.bool_(True), figures={"t": torch.tensor(2.0), "n": np.float32(1.5)})
    assert entry["status"] == "held" and entry["figures"]["t"]["value"] == 2.0
    assert claims.claim("np2", "numbers", lambda f: np.float64(f["t"]) > 1, figures={"t": 2.0})["status"] == "held"


@pytest.mark.parametrize("kwargs,error", [
    (dict(name="", expected="e", holds=True), ValueError),
    (dict(name="n", expected="", holds=True), ValueError),
    (dict(name="n", expected="e", holds="yes"), TypeError),
    (dict(name="n", expected="e", holds=True, figures={"f": [1, 2]}), TypeError),
    (dict(name="n", expected="e", holds=lambda f: "yes"), TypeError),
])
def test_bad_claims_get_clear_errors(kwargs, error):
    with pytest.raises(error):
        claims.claim(**kwargs)


@pytest.mark.parametrize("kwargs,error", [
    (dict(name="", says="s", holds=True), ValueError),
    (dict(name="d", says="", holds=True), ValueError),
    (dict(name="d", says="s", holds="maybe"), TypeError),
])
def test_bad_diagnoses_get_clear_errors(kwargs, error):
    with pytest.raises(error):
        claims.diagnosis(**kwargs)


def test_guess_none_nudges_and_a_guess_is_compared(capsys):
    assert claims.guess(None, 4.0, "us") is None
    assert "no prediction written" in capsys.readouterr().out
    assert claims.guess(3.0, 4.0, "us") is True
    assert claims.guess(0.1, 4.0, "us") is False
    assert "more than 2x off" in capsys.readouterr().out


def test_claims_are_read_back_and_tallied():
    held = {"name": "a", "status": "held"}
    nb = {"cells": [{"cell_type": "code", "outputs": [{"output_type": "display_data",
                                                       "data": {"text/plain": "...", claims.MIME: held}}]},
                    {"cell_type": "markdown", "source": "x"}]}
    found = claims.claims_in(nb)
    assert found == {"a": held}
    assert claims.tally({"a": held, "b": {"status": "skipped"}, "c": {"status": "inconclusive"}}) == {
        "held": 1, "differs": 0, "failed": 0, "inconclusive": 1, "skipped": 1}


def test_the_bootstrap_is_seeded_by_the_claim_name():
    s = stats.Samples.of([1.0, 1.4, 0.9, 1.2, 1.1, 0.95, 1.3])
    first = stats.decide(lambda f: f["s"] > 1.1, {"s": s.median}, {"s": s}, seed="x")
    assert stats.decide(lambda f: f["s"] > 1.1, {"s": s.median}, {"s": s}, seed="x") == first


def scripted_proc(monkeypatch, readings: list[tuple[int, int]], clock: list[float]):
    """/proc read as scripted: each reading is (machine busy ticks, own ticks) at the next clock time, on 2 CPUs at
    100 ticks/s. Returns a function that moves on to the next reading."""
    readings, times = iter(readings), iter(clock)
    now = [next(readings)]
    monkeypatch.setattr(stats, "_clock_ticks", lambda: 100)
    monkeypatch.setattr(stats.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(stats.time, "monotonic", lambda: next(times))
    monkeypatch.setattr(stats, "_machine_busy_ticks", lambda: now[0][0])
    monkeypatch.setattr(stats, "_own_ticks", lambda: now[0][1])
    return lambda: now.__setitem__(0, next(readings))


def test_host_load_is_the_machine_s_busy_time_less_this_process_tree(monkeypatch):
    advance = scripted_proc(monkeypatch, [(1000, 50), (1000 + 300, 50 + 100)], [10.0, 12.0])
    load = stats.HostLoad()
    advance()
    # 2 s on 2 CPUs at 100 ticks/s = 400 ticks; others used 300 - 100 = 200 of them
    assert load.others_share() == pytest.approx(0.5)


def test_own_ticks_count_a_child_this_process_waited_for():
    import subprocess
    import sys
    if stats._machine_busy_ticks() is None:
        pytest.skip("no /proc here: the host's load is not read")
    before = stats._own_ticks()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                    "while time.process_time() - t < 0.5: pass"], check=True)
    assert stats._own_ticks() - before >= 0.4 * stats._clock_ticks()


def test_a_claim_right_after_another_keeps_the_last_load_reading(monkeypatch):
    advance = scripted_proc(monkeypatch, [(1000, 0), (1400, 0), (1401, 0)], [0.0, 2.0, 2.01])
    load = stats.HostLoad()
    advance()
    assert load.others_share() == pytest.approx(1.0)
    advance()
    assert load.others_share() == pytest.approx(1.0)  # 10 ms later: too short to read, the last share stands


def test_a_burst_while_a_figure_was_timed_is_not_diluted_by_a_quiet_cell():
    """The window since the last claim was quiet (None here), but other processes took 60% of the CPU while the
    figure itself was timed: the miss is noise, INCONCLUSIVE, and the Samples carry that load through map()."""
    loaded = summarize([1.0] * 10)
    object.__setattr__(loaded, "host_busy", 0.6)
    fast = loaded.map(lambda ms: 1 / ms)
    assert fast.busy == 0.6
    entry = claims.claim("t", "fast does over 2 per ms", lambda f: f["fast"] > 2, figures={"fast": fast})
    assert entry["status"] == "inconclusive" and entry["host_busy"] == 0.6
    quiet = stats.Samples.of([1.0] * 10, busy=0.1)
    assert claims.claim("q", "over 2", lambda f: f["q"] > 2, figures={"q": quiet})["status"] == "failed"


def test_bench_records_what_other_processes_took_while_it_ran(monkeypatch):
    from labkit import timing
    shares = iter([0.7])
    monkeypatch.setattr(timing.HostLoad, "others_share", lambda self: next(shares))
    t = timing.bench(lambda: None, device="cpu", warmup_ms=1, rep_ms=2)
    assert t.host_busy == 0.7 and t.as_samples().busy == 0.7
