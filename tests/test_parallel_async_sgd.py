"""labkit.parallel.async_sgd: stale gradients slow or break SGD; a smaller step brings it back."""
import math

import pytest

from labkit.parallel.async_sgd import stale_sgd


def test_stale_sgd_staleness_hurts_and_smaller_steps_help():
    fresh = stale_sgd(0, steps=150, lr_times_l=0.5)
    stale = stale_sgd(8, steps=150, lr_times_l=0.5)
    slow = stale_sgd(8, steps=150, lr_times_l=0.5 / 8)
    assert len(fresh) == len(stale) == len(slow) == 150
    assert fresh[-1] < fresh[0] / 100
    assert not math.isfinite(stale[-1]) or stale[-1] > fresh[0]
    assert math.isfinite(slow[-1]) and slow[-1] < slow[0]
    with pytest.raises(ValueError):
        stale_sgd(-1)
