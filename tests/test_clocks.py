"""labkit.clocks against a fake nvidia-smi on PATH, and without one."""
import math
import os
import stat

import pytest

from labkit import clocks

FAKE = """#!/bin/sh
case "$*" in
  *"-q -d CLOCK"*) echo "Clocks"; echo "    SM                                : 1980 MHz";;
  *"-lms"*) for i in 1 2 3; do echo "2026/11/22 16:05:12.$((i * 100)), $((1900 + i)), 650.5, 54"; sleep 0.05; done;
            echo "not a sample"; : > "$FAKE_SMI_PRINTED"; exec sleep 30;;
  *"--query-gpu=clocks.sm,clocks.max.sm"*) echo "1755, 1980, 2619, 412.25, 700.00, [N/A]";;
  *) exit 3;;
esac
"""


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    path = tmp_path / "nvidia-smi"
    path.write_text(FAKE)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_PRINTED", str(tmp_path / "printed"))  # made once the samples are all out
    return path


def test_without_nvidia_smi_everything_is_none(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert clocks.nvidia_smi() is None
    assert clocks.report() is None and clocks.query() is None
    with clocks.Sampler() as s:
        pass
    assert s.samples == [] and s.at(0.0) is None


def test_report_and_query(fake_smi):
    assert "1980 MHz" in clocks.report("0")
    q = clocks.query("0")
    assert q["clocks.sm"] == 1755 and q["clocks.max.sm"] == 1980 and q["power.limit"] == 700
    assert math.isnan(q["temperature.gpu"])  # "[N/A]" is not a number


def test_sampler_parses_lines_and_stops_the_process(fake_smi):
    import time

    printed = fake_smi.parent / "printed"
    with clocks.Sampler("0", every_ms=50) as s:
        for _ in range(6000):  # until the fake has printed every line, however slow the machine (the bound: a hang)
            if printed.exists():
                break
            time.sleep(0.01)
    assert [x.sm_mhz for x in s.samples] == [1901, 1902, 1903]
    assert s.samples[0].power_w == 650.5 and s.samples[0].temp_c == 54
    assert s._proc.poll() is not None  # terminated, not left running
    assert s.at(s.samples[2].t + 0.01) == s.samples[2]


def test_parse_sample_rejects_other_lines():
    assert clocks.parse_sample("timestamp, clocks.sm") is None
    assert clocks.parse_sample("2026/11/22 16:05:12.100, 1900, 650.5") is None
    assert clocks.parse_sample("2026/11/22 16:05:12.100, 1900, [N/A], 50").power_w != clocks.parse_sample(
        "2026/11/22 16:05:12.100, 1900, [N/A], 50").power_w  # NaN


def test_lanes_table():
    assert clocks.fp32_lanes_per_sm(9, 0) == 128 and clocks.fp32_lanes_per_sm(8, 0) == 64
    assert clocks.fp32_lanes_per_sm(1, 0) is None
