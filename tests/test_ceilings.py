import dataclasses
import json

import pytest
import torch

import labkit
from labkit import ceilings


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache, and quick-mode sizes on any device: these tests check caching, not the figures
    (a full-size measurement takes a minute on a GPU)."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(labkit.device, "_current", dataclasses.replace(labkit.device.current(), quick=True))
    return tmp_path


def test_measured_once_then_cached(cache, monkeypatch):
    first = ceilings.get()
    assert first.copy_gbps > 0 and first.matmul_tflops["fp32"] > 0
    files = list(cache.glob("ceilings-*.json"))
    assert len(files) == 1
    monkeypatch.setattr(ceilings, "measure", lambda: pytest.fail("measured again despite the cache"))
    second = ceilings.get()
    assert second == first


def test_damaged_cache_is_measured_again(cache):
    ceilings.get()
    path = next(cache.glob("ceilings-*.json"))
    path.write_text("{not json")
    again = ceilings.get()
    assert again.copy_gbps > 0
    json.loads(path.read_text())  # rewritten


def test_a_refresh_never_lowers_a_ceiling_measured_before(cache, monkeypatch):
    quiet = ceilings.get()
    busy = dataclasses.replace(quiet, copy_gbps=quiet.copy_gbps / 10, matmul_tflops={"fp32": 1e9})
    monkeypatch.setattr(ceilings, "measure", lambda: busy)
    again = ceilings.get(refresh=True)
    assert again.copy_gbps == quiet.copy_gbps and again.matmul_tflops["fp32"] == 1e9  # the higher of each
    assert ceilings.cached().copy_gbps == quiet.copy_gbps


def test_fractions_and_ridge():
    c = ceilings.Ceilings(machine="m", copy_gbps=1000.0, matmul_tflops={"bf16": 500.0})
    assert c.copy_fraction(850.0) == pytest.approx(0.85)
    assert c.matmul_fraction(250.0, "bf16") == pytest.approx(0.5)
    assert c.ridge("bf16") == pytest.approx(500.0)
    assert "1,000 GB/s" in c.table()


def test_measurement_records_when_load_threads_and_every_repeat(cache):
    c = ceilings.get()
    assert c.measured_at and c.cores >= 1 and c.threads == c.cores
    assert len(c.repeats["copy_gbps"]) == ceilings.REPEATS and len(c.repeats["matmul_tflops.fp32"]) == ceilings.REPEATS
    assert c.copy_gbps == pytest.approx(max(c.repeats["copy_gbps"]), rel=1e-5)  # the best median is kept
    assert "measured" in c.table() and "labkit info --refresh" in c.table()


def test_small_rates_keep_their_significant_digits():
    c = ceilings.Ceilings(machine="m", copy_gbps=2.789, matmul_tflops={"fp32": 0.0025326})
    assert "0.002533 TFLOP/s" in c.table() and "2.789 GB/s" in c.table() and "0.00 TFLOP/s" not in c.table()


CPU = labkit.device.Setup(device=torch.device("cpu"), quick=True, triton_interpreter=True)


def _fake(copy: float, tflops: float, load: float = 0.0) -> ceilings.Ceilings:
    return ceilings.Ceilings(machine="m", copy_gbps=copy, matmul_tflops={"fp32": tflops}, load=load, cores=2)


def test_implausible_ceilings_are_measured_again(monkeypatch, capsys):
    tries = iter([_fake(0.01, 0.0), _fake(20.0, 0.05)])
    monkeypatch.setattr(ceilings, "_measure_once", lambda: next(tries))
    monkeypatch.setattr(ceilings, "current", lambda: CPU)
    c = ceilings.measure()
    assert c.copy_gbps == 20.0 and not c.warnings


def test_ceilings_that_stay_implausible_or_busy_say_so(monkeypatch, capsys):
    monkeypatch.setattr(ceilings, "_measure_once", lambda: _fake(0.01, 0.05, load=7.5))
    monkeypatch.setattr(ceilings, "current", lambda: CPU)
    c = ceilings.measure(attempts=2)
    assert any("implausible after 2 attempts: copy 0.01 GB/s" in w for w in c.warnings)
    assert any("busy (load 7.5 on 2 cores)" in w and "labkit info --refresh" in w for w in c.warnings)
    assert "ceilings: measured while the machine was busy" in capsys.readouterr().out


def test_a_fraction_far_above_one_measures_the_ceilings_again_once(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(ceilings, "get", lambda refresh=False: calls.append(refresh) or _fake(40.0, 0.5))
    stale = _fake(4.0, 0.001)
    assert stale.copy_fraction(32.0) == pytest.approx(0.8)  # 32 / 40 after measuring again, not 8 (800%)
    assert calls == [True] and "measured again" in capsys.readouterr().out
    assert stale.copy_fraction(100.0) == pytest.approx(2.5) and calls == [True]  # only once per process
    assert stale.matmul_fraction(0.25) == pytest.approx(0.5)
