"""Inputs shared by visible and hidden cases: non-contiguous views, small MLPs, the check's device."""
from __future__ import annotations

import torch

# name -> the view it makes of a 2-D tensor (on the tensor's own device)
VIEWS = {
    "cols_step2": lambda t: t[:, ::2],
    "transposed": lambda t: t.t(),
    "row_slice": lambda t: t[:, 1:-1],
}


def view(t: torch.Tensor, name: str | None) -> torch.Tensor:
    """The non-contiguous view `name` of `t` (None: `t` itself)."""
    if name is None:
        return t
    if name not in VIEWS:
        raise ValueError(f"unknown view {name!r}: choose one of {sorted(VIEWS)} or None")
    return VIEWS[name](t)


def here() -> torch.device:
    """The device labkit.setup() chose: where the visible checks run."""
    from labkit.device import current
    return current().device


def make_mlp(sizes: list[int], state: dict, device: torch.device | str) -> torch.nn.Module:
    """Linear -> Tanh -> Linear with layer sizes `sizes`, loaded from `state`, on `device`."""
    a, b, c = sizes
    model = torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.Tanh(), torch.nn.Linear(b, c))
    model.load_state_dict(state)
    return model.to(device)


def mlp_state(g: torch.Generator, sizes: list[int]) -> dict:
    """Random weights (drawn from `g`) for make_mlp(sizes, ...)."""
    a, b, c = sizes
    ref = torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.Tanh(), torch.nn.Linear(b, c))
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return {k: v.clone() for k, v in ref.state_dict().items()}
