"""labkit.grading.baseline: before each baseline round the L2 is given back to normal accesses, so a persisting-L2
carve-out the student's process left on the GPU does not shrink the cache the baseline is timed with."""
import subprocess
import sys
import textwrap

import pytest
import torch

from labkit.grading import baseline


class FakeDriver:
    def __init__(self, code: int):
        self.code, self.calls = code, []

    def cuCtxSetLimit(self, which, size):  # noqa: N802 (the driver's name)
        self.calls.append(("limit", which.value, size.value))
        return self.code

    def cuCtxResetPersistingL2Cache(self):  # noqa: N802
        self.calls.append(("reset",))
        return 0


def test_the_reset_sets_no_set_aside_and_makes_every_line_normal(monkeypatch):
    fake = FakeDriver(0)
    monkeypatch.setattr(baseline, "cuda_driver", lambda: fake)
    assert baseline.reset_persisting_l2() is None
    assert fake.calls == [("limit", baseline.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0), ("reset",)]


def test_a_refusal_or_a_missing_driver_is_said_not_raised(monkeypatch):
    monkeypatch.setattr(baseline, "cuda_driver", lambda: FakeDriver(201))  # CUDA_ERROR_INVALID_CONTEXT
    assert "201" in baseline.reset_persisting_l2()
    monkeypatch.setattr(baseline, "cuda_driver", lambda: None)
    assert "no CUDA driver" in baseline.reset_persisting_l2()
    assert baseline.persisting_l2_limit() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_carve_out_set_on_the_gpu_is_gone_after_the_reset():
    # in a process of its own: the set-aside is the device's, and this one is left as it was found (none)
    code = textwrap.dedent("""
        import ctypes, torch
        from labkit.grading import baseline
        torch.ones(1, device="cuda"); torch.cuda.synchronize()
        cu = baseline.cuda_driver()
        most = torch.cuda.get_device_properties(0).L2_cache_size // 2
        assert cu.cuCtxSetLimit(ctypes.c_int(baseline.CU_LIMIT_PERSISTING_L2_CACHE_SIZE), ctypes.c_size_t(most)) == 0
        before = baseline.persisting_l2_limit()
        assert baseline.reset_persisting_l2() is None
        print(before, baseline.persisting_l2_limit())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = map(int, out.stdout.split())
    assert before > 0 and after == 0
