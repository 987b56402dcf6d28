import json

import pytest

import labkit
from labkit import ceilings


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
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
    c = ceilings.get()
    path = next(cache.glob("ceilings-*.json"))
    path.write_text("{not json")
    again = ceilings.get()
    assert again.copy_gbps > 0
    json.loads(path.read_text())  # rewritten


def test_fractions_and_ridge():
    c = ceilings.Ceilings(machine="m", copy_gbps=1000.0, matmul_tflops={"bf16": 500.0})
    assert c.copy_fraction(850.0) == pytest.approx(0.85)
    assert c.matmul_fraction(250.0, "bf16") == pytest.approx(0.5)
    assert c.ridge("bf16") == pytest.approx(500.0)
    assert "1,000 GB/s" in c.table()
