"""labkit.transfer: the latency + bandwidth fit, size sweeps, copy buffers, timelines."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from labkit import transfer  # noqa: E402

CUDA = torch.cuda.is_available()


def test_sweep_sizes_geometric_and_ends_at_hi():
    assert transfer.sweep_sizes(1, 64, 4) == [1, 4, 16, 64]
    assert transfer.sweep_sizes(1, 100, 4) == [1, 4, 16, 64, 100]
    assert transfer.sweep_sizes(3, 3) == [3]
    assert transfer.sweep_sizes(1, 2**30, 2)[-1] == 2**30
    assert len(transfer.sweep_sizes(1, 2**30, 2)) == 31


def test_pcie_peak_matches_the_spec_figures():
    assert transfer.pcie_peak_gbps(5, 16) == pytest.approx(63.02, abs=0.01)  # 32 GT/s x 16 x 128/130 / 8
    assert transfer.pcie_peak_gbps(4, 16) == pytest.approx(31.51, abs=0.01)
    assert transfer.pcie_peak_gbps(3, 8) == pytest.approx(7.877, abs=0.001)
    assert transfer.pcie_peak_gbps(2, 16) == pytest.approx(8.0)


def test_host_cache_is_a_plausible_size():
    size = transfer.host_cache_bytes()
    assert size == 0 or 2**16 <= size <= 2**32, f"{size} bytes is no CPU cache size"


@pytest.mark.parametrize("gen,width", [(7, 16), (0, 16), (5, 3), (5, 0)])
def test_pcie_peak_rejects_unknown_links(gen, width):
    with pytest.raises(ValueError, match="PCIe"):
        transfer.pcie_peak_gbps(gen, width)


@pytest.mark.parametrize("lo,hi,step", [(0, 10, 2), (10, 5, 2), (1, 10, 1)])
def test_sweep_sizes_rejects_bad_ranges(lo, hi, step):
    with pytest.raises(ValueError, match="sweep_sizes"):
        transfer.sweep_sizes(lo, hi, step)


@pytest.mark.parametrize("lat_us,bw_gbps", [(9.5, 55.0), (0.3, 12.7), (20.0, 3.1)])
def test_fit_recovers_exact_model(lat_us, bw_gbps):
    n = np.array(transfer.sweep_sizes(1, 2**30, 4), dtype=float)
    t = lat_us * 1e-3 + n / (bw_gbps * 1e6)
    fit = transfer.fit_latency_bandwidth(n, t)
    assert fit.latency_us == pytest.approx(lat_us, rel=1e-9)
    assert fit.bandwidth_gbps == pytest.approx(bw_gbps, rel=1e-9)
    assert fit.max_rel_error < 1e-9
    np.testing.assert_allclose(fit.time_ms(n), t, rtol=1e-9)
    assert fit.half_bandwidth_bytes == pytest.approx(lat_us * 1e-6 * bw_gbps * 1e9, rel=1e-9)


def test_fit_with_noise_stays_close_and_reports_error():
    rng = np.random.default_rng(1234)
    n = np.array(transfer.sweep_sizes(7, 3 * 2**28, 2), dtype=float)
    t = 4e-3 + n / 40e6
    noisy = t * (1 + rng.uniform(-0.03, 0.03, size=t.shape))
    fit = transfer.fit_latency_bandwidth(n.tolist(), noisy.tolist())
    assert fit.latency_us == pytest.approx(4.0, rel=0.05)
    assert fit.bandwidth_gbps == pytest.approx(40.0, rel=0.05)
    assert 0.005 < fit.max_rel_error < 0.1


def test_fit_without_latency_gives_zero_latency():
    n = np.array([1e3, 1e5, 1e7, 1e9])
    t = n / 20e6 * np.array([0.5, 1.0, 1.0, 1.0])  # the small point is *faster* than pure bandwidth
    fit = transfer.fit_latency_bandwidth(n, t)
    assert fit.latency_us == 0.0
    # rates of the points: 40, 20, 20, 20 GB/s; relative least squares on 1/rate gives
    # sum(r^2) / sum(r) = (1600 + 3 * 400) / 100 = 28 GB/s
    assert fit.bandwidth_gbps == pytest.approx(28.0, rel=1e-9)


@pytest.mark.parametrize("n,t,match", [
    ([1, 2, 3], [1, 2], "one time per size"),
    ([5, 5, 5], [1, 2, 3], "two different sizes"),
    ([1, 2], [0.0, 1.0], "positive"),
    ([1, 2], [float("nan"), 1.0], "positive"),
    ([1e3, 1e6], [2.0, 1.0], "do not grow"),
])
def test_fit_rejects_bad_points(n, t, match):
    with pytest.raises(ValueError, match=match):
        transfer.fit_latency_bandwidth(n, t)


@pytest.mark.parametrize("nbytes", [1, 777, 3 * 2**16 + 5])
def test_host_copy_buffers_copy_correctly(nbytes):
    src, dst = transfer.copy_buffers(nbytes, "h2h", device="cpu")
    assert src.dtype == dst.dtype == torch.uint8 and src.numel() == dst.numel() == nbytes
    dst.fill_(255)
    src[-1] = 7  # at least one element differs from the poison
    dst.copy_(src)
    assert torch.equal(dst, src)


def test_copy_buffers_errors_say_what_to_do():
    with pytest.raises(ValueError, match="use one of"):
        transfer.copy_buffers(8, "sideways", device="cpu")
    with pytest.raises(ValueError, match="pinned=False"):
        transfer.copy_buffers(8, "h2h", pinned=True, device="cpu")
    with pytest.raises(RuntimeError, match="h2h"):
        transfer.copy_buffers(8, "h2d", device="cpu")
    with pytest.raises(ValueError, match="nbytes"):
        transfer.copy_buffers(0, "h2h", device="cpu")


@pytest.mark.skipif(CUDA, reason="checks the message on a machine without a GPU")
def test_pinned_without_gpu_says_so():
    with pytest.raises(RuntimeError, match="CUDA"):
        transfer.copy_buffers(8, "h2d", pinned=True, device=torch.device("cuda"))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("pinned", [False, True])
def test_gpu_copy_buffers_copy_correctly(direction, pinned):
    src, dst = transfer.copy_buffers(4099, direction, pinned, device="cuda")
    assert (src.is_cuda, dst.is_cuda) == ((True, False) if direction == "d2h" else (False, True))
    host = dst if direction == "d2h" else src
    assert host.is_pinned() == pinned
    dst.fill_(255)
    src[0] = 3
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), src.cpu())


def test_host_cache_levels_are_plausible_and_ordered():
    sizes = {level: transfer.host_cache_bytes(level) for level in (1, 2, 3)}
    for level, size in sizes.items():
        assert size == 0 or 2**12 <= size <= 2**32, f"L{level}: {size} bytes is no CPU cache size"
    known = [sizes[k] for k in (1, 2, 3) if sizes[k]]
    assert known == sorted(known)
    assert transfer.host_cache_bytes() >= max(known, default=0)
    with pytest.raises(ValueError, match="cache level"):
        transfer.host_cache_bytes(4)


@pytest.mark.parametrize("n,chunk", [(1, 4), (7, 4), (8, 4), (9, 4), (1000, 1024), (5000, 1024)])
def test_staging_pieces_cover_the_host_buffer_in_order(n, chunk):
    host = torch.zeros(6000, dtype=torch.uint8)
    ring = torch.arange(chunk, dtype=torch.int64).remainder(251).to(torch.uint8) + 1
    pieces = transfer.staging_pieces(host, ring, n)
    assert all(h.data_ptr() == host[o:].data_ptr() for (h, _), o in zip(pieces, range(0, n, chunk)))
    for h, r in pieces:  # 'd2h': staging -> pageable
        h.copy_(r)
    assert torch.equal(host[:n], ring.repeat(n // chunk + 1)[:n]) and not host[n:].any()
    with pytest.raises(ValueError, match="between 1 and"):
        transfer.staging_pieces(host, ring, 6001)


def test_staging_sweep_times_each_size_on_one_thread():
    threads = torch.get_num_threads()
    timings = transfer.staging_sweep([1, 3 * 2**10 + 1, 2**16], "h2d", chunk=2**10, rep_ms=5, warmup_ms=1)
    assert torch.get_num_threads() == threads
    assert len(timings) == 3 and all(t.n >= 5 and t.median_ms > 0 for t in timings)
    assert len(transfer.staging_sweep([2**12], "d2h", rep_ms=5, warmup_ms=1)) == 1
    with pytest.raises(ValueError, match="'h2d' or 'd2h'"):
        transfer.staging_sweep([8], "h2h")
    with pytest.raises(ValueError, match="sizes >= 1"):
        transfer.staging_sweep([0], "h2d")


def test_pageable_parts_times_the_three_parts_in_turns_on_a_gpu_only():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        transfer.pageable_parts(2**12, device="cpu")
    if not torch.cuda.is_available():
        pytest.skip("the timed part needs a CUDA GPU (pinned memory and a link)")
    threads = torch.get_num_threads()
    parts = transfer.pageable_parts(2**20, device="cuda", rounds=4)
    assert torch.get_num_threads() == threads
    assert list(parts) == ["pageable", "pinned", "staging memcpy"]
    assert all(t.n >= 4 and t.median_ms > 0 for t in parts.values())


def test_count_wrong_counts_differences():
    expected = torch.randn(1001, dtype=torch.float64)
    got = expected.clone()
    assert transfer.count_wrong(got, expected) == 0
    got[::10] = float("nan")  # NaN != anything: poisoned elements count as wrong
    assert transfer.count_wrong(got, expected) == 101
    with pytest.raises(ValueError, match="shapes differ"):
        transfer.count_wrong(got[:5], expected)


class _FakeEvent:
    def __init__(self, t):
        self.t = t

    def elapsed_time(self, other):
        return other.t - self.t


def test_timeline_and_plot():
    ref = _FakeEvent(100.0)
    spans = transfer.timeline(ref, {"copy": (_FakeEvent(100.5), _FakeEvent(103.0)),
                                    "compute": (_FakeEvent(101.0), _FakeEvent(102.25))})
    assert spans == {"copy": (0.5, 3.0), "compute": (1.0, 2.25)}
    fig, ax = plt.subplots()
    transfer.plot_timeline(ax, spans, "two streams")
    bars = ax.patches
    assert len(bars) == 2
    assert [b.get_x() for b in bars] == [0.5, 1.0]
    assert [b.get_width() for b in bars] == [2.5, 1.25]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["copy", "compute"]
    plt.close(fig)
