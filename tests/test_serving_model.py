"""The served model and its runner on the CPU (CUDA graphs and bf16 are exercised by notebook 12 on a GPU)."""
import pytest
import torch

from labkit.serving.model import FixedTime, Runner, flops_per_sample, make_model, weight_bytes


def test_same_seed_same_weights_and_the_counts_add_up():
    a, b = make_model(7, 33, 3, 5, seed=4), make_model(7, 33, 3, 5, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(next(make_model(7, 33, 3, 5, seed=5).parameters()), next(a.parameters()))
    assert weight_bytes(a) == 4 * sum(p.numel() for p in a.parameters())
    weights = sum(m.weight.numel() for m in a if isinstance(m, torch.nn.Linear))
    assert flops_per_sample(7, 33, 3, 5) == 2 * weights


def test_runner_matches_the_model_in_float64_and_checks_its_input():
    model = make_model(6, 17, 2, 3, seed=1)
    x = torch.randn(11, 6)
    with torch.no_grad():
        ref = model.double()(x.double())
    out = Runner(make_model(6, 17, 2, 3, seed=1), "cpu")(x)
    assert out.dtype == torch.float32 and out.shape == (11, 3)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"\[b, 6\]"):
        Runner(model, "cpu", torch.float64)(torch.randn(2, 5))
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        Runner(model, "cpu", graphs=[1])


def test_runner_in_bf16_stays_close():
    x = torch.randn(4, 6)
    out = Runner(make_model(6, 17, 2, 3, seed=1), "cpu", torch.bfloat16)(x)
    with torch.no_grad():
        ref = make_model(6, 17, 2, 3, seed=1).double()(x.double())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=5e-2, atol=5e-2)


def test_fixed_time_stand_in_takes_its_time_whatever_the_batch(monkeypatch):
    from fake_clock import FakeClock
    from labkit.serving import model as servemodel

    clock = FakeClock()
    monkeypatch.setattr(servemodel, "time", clock)  # the sleeps it asks for, exactly (a real sleep only runs long)
    m = FixedTime(ms=20, d_out=3)
    for b in (1, 64):
        x = torch.randn(b, 5)
        y = m(x)
        torch.testing.assert_close(y, x.sum(1, keepdim=True).expand(b, 3))
    assert clock.slept == [0.02, 0.02]
    with pytest.raises(ValueError, match="ms >= 0"):
        FixedTime(ms=-1)


def test_warm_runs_every_size_and_leaves_answers_unchanged():
    runner = Runner(make_model(6, 17, 2, 3, seed=1), "cpu")
    seen = []
    runner.fn = lambda x, f=runner.fn: (seen.append(x.shape[0]), f(x))[1]
    x = torch.randn(5, 6)
    before = runner(x)
    seen.clear()
    runner.warm([4, 1, 16, 4], reps=2)
    assert seen == [1, 1, 4, 4, 16, 16]
    torch.testing.assert_close(runner(x), before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="lists GPU kernels: needs a CUDA GPU")
def test_gpu_kernel_names_lists_the_kernels_of_one_call():
    from labkit.serving.model import gpu_kernel_names

    x = torch.randn(8, 64, device="cuda")
    w = torch.randn(64, 64, device="cuda")
    names = gpu_kernel_names(lambda t: torch.nn.functional.gelu(t @ w), x)
    assert len(names) >= 2 and any("gelu" in n.lower() for n in names)
