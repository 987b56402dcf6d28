"""labkit.profiling.monitor: one clear message without NVML or a GPU; the sampling thread starts and stops
cleanly (with a fake NVML standing in for the driver)."""
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from fake_clock import FakeClock
from labkit.profiling import monitor


class FakeNVML:
    """Just the NVML calls the sampler makes, with values that change per call."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, count=1, fail_init=False, clock=None, hold_at=0, enough=0):
        self.count, self.fail_init, self.calls, self.shutdown = count, fail_init, 0, 0
        # clock: moved one 10 ms sample period per query; hold_at: that query waits for `release` (`held` says
        # it does); enough: set once that many queries started
        self.clock, self.hold_at, self.want = clock, hold_at, enough
        self.held, self.release, self.enough = threading.Event(), threading.Event(), threading.Event()

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shutdown += 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetUtilizationRates(self, h):
        self.calls += 1
        if self.calls == self.hold_at:
            self.held.set()
            self.release.wait(60)  # (a bound only against a hang)
        if self.want and self.calls >= self.want:
            self.enough.set()
        if self.clock is not None:
            self.clock.advance(0.01)
        return SimpleNamespace(gpu=self.calls % 101, memory=7)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=3 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetClockInfo(self, h, which):
        assert which == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetPowerUsage(self, h):
        return 123_456   # milliwatts

    def nvmlDeviceGetTemperature(self, h, which):
        return 41

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 0x1 | 0x4


def test_without_pynvml_one_clear_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import pynvml now raises ImportError
    s = monitor.Sampler()
    with s:
        pass
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "nvidia-ml-py" in out
    assert not s.ok and s.samples == [] and not s.running
    s.stop()   # stopping a sampler that never ran is fine


def test_without_a_gpu_one_clear_line(capsys):
    s = monitor.Sampler(nvml=FakeNVML(count=0)).start()
    assert "no NVIDIA GPU" in capsys.readouterr().out and not s.running
    s = monitor.Sampler(nvml=FakeNVML(fail_init=True), quiet=True).start()
    assert "NVML could not start" in s.message and capsys.readouterr().out == ""


def test_thread_samples_and_stops_cleanly(monkeypatch):
    # the sampler's clock is fake and moves 10 ms per query: times and marks are exact, whatever the machine's load
    clock = FakeClock()
    monkeypatch.setattr(monitor, "time", clock)
    fake = FakeNVML(clock=clock, hold_at=6, enough=9)
    before = threading.active_count()
    with monitor.Sampler(interval_s=0.01, nvml=fake) as s:
        assert s.running
        assert fake.held.wait(60)  # 5 samples taken (10..50 ms); the 6th query waits
        s.mark("phase two")
        fake.release.set()
        assert fake.enough.wait(60)  # sampling went on after the mark
    assert not s.running and threading.active_count() == before and fake.shutdown == 1
    assert s.ok and len(s.samples) == fake.calls >= 9  # one sample per query, to the last one
    first = s.samples[0]
    assert set(first) == set(monitor.FIELDS)
    assert first["sm_mhz"] == 1980 and first["power_w"] == pytest.approx(123.456) and first["mem_used_gib"] == 3
    assert first["throttle"] == ["idle", "software power cap"]
    ts = s.series("t")
    assert ts == pytest.approx([0.01 * (i + 1) for i in range(len(ts))]) and ts == sorted(ts) and ts[0] >= 0
    assert s.marks == [(pytest.approx(0.05), "phase two")]
    assert s.between(0, s.marks[0][0], "temp_c") == [41] * 5 and set(s.between(0, 99, "temp_c")) == {41}
    assert s.between(s.marks[0][0] + 1e-9, 99, "util_gpu") == list(range(6, fake.calls + 1))
    with pytest.raises(KeyError, match="fields"):
        s.series("fan")
    s.stop()
    assert fake.shutdown == 1


def test_a_failing_query_stops_sampling_with_a_message():
    fake = FakeNVML()
    fake.nvmlDeviceGetTemperature = lambda h, w: (_ for _ in ()).throw(RuntimeError("Not Supported"))
    s = monitor.Sampler(interval_s=0.01, nvml=fake).start()
    for _ in range(6000):  # the thread stops by itself after its first query (the bound only stops a hang)
        if not s.running:
            break
        time.sleep(0.01)
    s.stop()
    assert s.samples == [] and "Not Supported" in s.message and fake.calls == 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="interval_s"):
        monitor.Sampler(interval_s=0)
    s = monitor.Sampler(interval_s=0.01, nvml=FakeNVML()).start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            s.start()
    finally:
        s.stop()
    assert monitor.throttle_names(0) == [] and monitor.throttle_names(0x40) == ["hardware thermal slowdown"]
