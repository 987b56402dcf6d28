"""The in-process load generator: every request answered once with its own row, histograms per run, overload."""
import numpy as np
import pytest
import torch

from labkit.serving import inproc
from labkit.serving.model import FixedTime


@pytest.mark.parametrize("threaded", [True, False])
def test_every_request_gets_its_own_answer_and_the_histogram_is_this_runs(threaded):
    seen = []

    def model(x):  # row i's answer is its own sum: a mix-up between callers would show
        seen.append(x.shape[0])
        return x.sum(1, keepdim=True).expand(-1, 3).clone()

    rows = torch.arange(40, dtype=torch.float32).reshape(20, 2)
    res = inproc.run(model, rows, rate=400, max_batch=8, max_delay_s=0.002, max_s=0.5, timeout_s=5.0,
                     threaded=threaded)
    assert res.ok == res.sent > 50 and res.rejected == res.timeouts == res.errors == 0
    assert sum(k * v for k, v in res.batch_sizes.items()) == res.sent  # this run's requests only
    assert max(res.batch_sizes) <= 8 and set(seen) <= {1, 2, 4, 8}  # padded to the buckets
    assert (res.latencies_ms >= 0).all() and np.isfinite(res.latencies_ms).all()
    again = inproc.run(model, rows, rate=400, max_batch=8, max_delay_s=0.002, max_s=0.2, timeout_s=5.0)
    assert sum(k * v for k, v in again.batch_sizes.items()) == again.sent  # a fresh batcher: no carry-over


def test_an_unbatched_model_falls_behind_and_requests_time_out_or_are_refused():
    res = inproc.run(FixedTime(5.0, d_out=2), torch.zeros(4, 2), rate=1000, max_batch=1, max_delay_s=0.0,
                     max_s=0.3, timeout_s=0.2, max_queue=50)
    assert res.rejected > 0 and res.timeouts > 0  # 1000/s offered to a 200/s model behind a 50-deep queue
    assert res.ok + res.rejected + res.timeouts == res.sent
    assert set(res.batch_sizes) == {1} and res.throughput < 300


def test_batching_keeps_up_where_one_at_a_time_cannot():
    slow = FixedTime(5.0, d_out=2)  # 5 ms a batch whatever its size: 200/s one at a time
    one = inproc.run(slow, torch.zeros(4, 2), rate=600, max_batch=1, max_delay_s=0.0, max_s=0.5, timeout_s=0.3)
    many = inproc.run(slow, torch.zeros(4, 2), rate=600, max_batch=32, max_delay_s=0.0, max_s=0.5, timeout_s=0.3)
    assert many.ok == many.sent and many.mean_batch > 1.5
    assert one.ok < one.sent


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="rate > 0"):
        inproc.run(lambda x: x, torch.zeros(4, 2), rate=0, max_batch=4, max_delay_s=0.0)
    with pytest.raises(ValueError, match="inputs"):
        inproc.run(lambda x: x, torch.zeros(4), rate=10, max_batch=4, max_delay_s=0.0)
