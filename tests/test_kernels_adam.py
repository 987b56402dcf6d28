"""labkit.kernels.TritonAdamW against torch.optim.AdamW(foreach=False), step for step."""
import math

import pytest
import torch

import labkit
from labkit import kernels

DEV = labkit.current().device
SHAPES = [(37,), (5, 13), (129,), (3, 7, 11), (1,)]


def make_params(dtype=torch.float32):
    return [torch.nn.Parameter(torch.randn(*s, device=DEV).to(dtype)) for s in SHAPES]


def test_adamw_matches_torch_for_12_steps():
    ours = make_params()
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    kw = dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    # Two parameter groups with different hyperparameters.
    opt = kernels.TritonAdamW([{"params": ours[:3]}, {"params": ours[3:], "lr": 1e-2, "weight_decay": 0.0}], **kw)
    ref = torch.optim.AdamW([{"params": theirs[:3]}, {"params": theirs[3:], "lr": 1e-2, "weight_decay": 0.0}],
                            foreach=False, **kw)
    for step in range(12):
        for i, (p, q) in enumerate(zip(ours, theirs)):
            if step == 4 and i == 1:  # a parameter without a gradient this step is skipped
                p.grad = q.grad = None
                continue
            g = torch.randn_like(p)
            if i == 1:
                g = torch.randn(p.shape[::-1], device=DEV).t()  # a non-contiguous gradient
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        for p, q in zip(ours, theirs):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
    assert float(opt.state[ours[1]]["step"]) == 11 and float(opt.state[ours[0]]["step"]) == 12
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(opt.state[p]["exp_avg_sq"], ref.state[q]["exp_avg_sq"], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_adamw_16bit_params_keep_fp32_masters(dtype):
    ours = make_params(dtype)
    theirs = [torch.nn.Parameter(p.detach().float()) for p in ours]  # what the fp32 masters should follow
    opt = kernels.TritonAdamW(ours, lr=1e-2, weight_decay=0.05)
    ref = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.05, foreach=False)
    for _ in range(10):
        for p, q in zip(ours, theirs):
            g = torch.randn_like(p)
            p.grad, q.grad = g, g.float()
        opt.step()
        ref.step()
    for p, q in zip(ours, theirs):
        master = opt.state[p]["master"]
        torch.testing.assert_close(master, q.detach(), rtol=1e-5, atol=1e-6)
        assert p.dtype == dtype
        # The parameter is its master rounded to 16 bits (within one unit in the last place).
        torch.testing.assert_close(p.detach().float(), master, rtol=2 ** -7 if dtype == torch.bfloat16 else 2 ** -10,
                                   atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_adamw_16bit_without_master_weights_follows_torch_fused_layout(dtype):
    # Moments kept in the parameter's dtype (like torch.optim.AdamW(fused=True)); the update is fp32
    # math on the rounded values, so the reference applies the same roundings step by step.
    # (Not fp16: its exp_avg_sq underflows to 0 for small gradients, and then the step is lr / eps-sized
    # whichever way the rounding went; that is why fp16 training keeps fp32 moments.)
    ours = make_params(dtype)
    p64 = [p.detach().double() for p in ours]
    m64 = [torch.zeros_like(p) for p in p64]
    v64 = [torch.zeros_like(p) for p in p64]
    lr, wd, (b1, b2), eps = 1e-2, 0.05, (0.9, 0.999), 1e-8
    opt = kernels.TritonAdamW(ours, lr=lr, weight_decay=wd, master_weights=False)
    r = lambda t: t.to(dtype).double()  # noqa: E731  (rounding to the stored dtype)
    for step in range(1, 6):
        for i, p in enumerate(ours):
            p.grad = torch.randn_like(p)
            g = p.grad.double()
            m64[i] = r(m64[i] + (1 - b1) * (g - m64[i]))
            v64[i] = r(v64[i] * b2 + (1 - b2) * g * g)
            denom = (v64[i].sqrt() / math.sqrt(1 - b2 ** step)) + eps
            p64[i] = r(p64[i] * (1 - lr * wd) - lr / (1 - b1 ** step) * m64[i] / denom)
        opt.step()
        for i, p in enumerate(ours):
            assert "master" not in opt.state[p] and opt.state[p]["exp_avg"].dtype == dtype
            ulp = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
            torch.testing.assert_close(opt.state[p]["exp_avg"].double(), m64[i], rtol=ulp, atol=1e-3)
            torch.testing.assert_close(p.detach().double(), p64[i], rtol=ulp, atol=1e-3)
            p64[i] = p.detach().double()  # follow our rounding, so errors do not add up over steps
            m64[i] = opt.state[p]["exp_avg"].double()
            v64[i] = opt.state[p]["exp_avg_sq"].double()


def test_adamw_rejects_what_it_does_not_support():
    p = torch.nn.Parameter(torch.randn(3, device=DEV))
    with pytest.raises(NotImplementedError, match="amsgrad"):
        kernels.TritonAdamW([p], amsgrad=True)
    with pytest.raises(NotImplementedError, match="maximize"):
        kernels.TritonAdamW([p], maximize=True)
    with pytest.raises(ValueError, match="lr"):
        kernels.TritonAdamW([p], lr=-1.0)
    q = torch.nn.Parameter(torch.randn(3, device=DEV, dtype=torch.float64))
    q.grad = torch.randn_like(q)
    with pytest.raises(TypeError, match="float64.*accepted"):
        kernels.TritonAdamW([q]).step()
