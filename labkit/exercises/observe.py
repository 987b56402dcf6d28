"""Observations: what a call produced, as plain data, and how an expected one differs from it.

Tensors become {"__tensor__": a CPU copy, "device": str}, so an observation travels from the
grading child to the parent through torch.save / torch.load(weights_only=True).
"""
from __future__ import annotations

import math
from typing import Any

import torch


def snapshot(obj: Any, _depth: int = 0) -> Any:
    """`obj` as plain data: tensors become {"__tensor__": cpu copy, "device": str}, containers recurse."""
    if _depth > 20:
        return {"__object__": "nested too deeply"}
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        device = str(t.device)
        if t.device.type == "meta":  # no values: keep shape and dtype in a one-element expanded tensor
            cpu = torch.zeros((), dtype=t.dtype).expand(t.shape)
        else:
            cpu = t.to("cpu").clone()
        if type(cpu) is not torch.Tensor:
            cpu = cpu.as_subclass(torch.Tensor)
        return {"__tensor__": cpu, "device": device}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        items = [snapshot(v, _depth + 1) for v in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        return {str(k): snapshot(v, _depth + 1) for k, v in obj.items()}
    if isinstance(obj, (torch.dtype, torch.device)):
        return str(obj)
    if hasattr(obj, "item") and hasattr(obj, "dtype"):  # numpy scalars
        try:
            return obj.item()
        except Exception:
            pass
    return {"__object__": type(obj).__name__}


def expect_tensor(t: torch.Tensor, device: str) -> dict:
    """An expected tensor (values from a CPU reference) that must come back on `device`."""
    return snapshot(t.to("meta") if device == "meta" else t) | {"device": device}


def _is_tensor(x: Any) -> bool:
    return isinstance(x, dict) and "__tensor__" in x


def _kind(x: Any) -> str:
    if _is_tensor(x):
        t = x["__tensor__"]
        return f"a tensor of shape {tuple(t.shape)}, {t.dtype} on {x['device']}"
    if isinstance(x, dict) and "__object__" in x:
        return f"a {x['__object__']} object"
    return f"{x!r} ({type(x).__name__})" if isinstance(x, (bool, int, float, type(None))) else type(x).__name__


def _fmt(v: float) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _same_device(expected: str, got: str) -> bool:
    e, g = torch.device(expected), torch.device(got)
    return e.type == g.type and (e.index is None or e.index == (g.index or 0))


def _tensor_problem(path: str, exp: dict, got: Any, rtol: float, atol: float) -> str | None:
    if not _is_tensor(got):
        return f"{path}: expected a torch.Tensor, got {_kind(got)}"
    e, g = exp["__tensor__"], got["__tensor__"]
    if tuple(e.shape) != tuple(g.shape):
        return f"{path}: wrong shape: expected {tuple(e.shape)}, got {tuple(g.shape)}"
    if e.dtype != g.dtype:
        return f"{path}: wrong dtype: expected {e.dtype}, got {g.dtype}"
    if not _same_device(exp["device"], got["device"]):
        note = META_NOTE if exp["device"] == "meta" else ""
        return f"{path}: wrong device: expected {exp['device']}, got {got['device']}{note}"
    if exp["device"] == "meta" or e.numel() == 0:
        return None
    if e.dtype == torch.bool or not (e.is_floating_point() or e.is_complex()):
        bad = e != g
    else:
        e64, g64 = e.double(), g.double()
        bad = ~((g64 - e64).abs() <= atol + rtol * e64.abs())  # NaN in g counts as wrong
        bad |= torch.isnan(g64) & ~torch.isnan(e64)
        bad &= ~(torch.isnan(e64) & torch.isnan(g64))
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    idx = bad.nonzero()[:4].tolist()
    shown = "; ".join(f"{list(i)}: expected {_fmt(e[tuple(i)].item())}, got {_fmt(g[tuple(i)].item())}"
                      for i in idx)
    tol = "" if e.dtype == torch.bool or not e.is_floating_point() else f" (rtol={rtol:g}, atol={atol:g})"
    return f"{path}: {n_bad} of {e.numel()} elements differ{tol}; first ones: {shown}"


META_NOTE = " ('meta' stands in for a GPU on this machine: tensors there have shapes and dtypes, no values)"


def compare(expected: Any, got: Any, rtol: float = 0.0, atol: float = 0.0, path: str = "output",
            limit: int = 3) -> list[str]:
    """What differs between an expected observation and the one a student's code produced."""
    problems: list[str] = []

    def walk(e: Any, g: Any, p: str) -> None:
        if len(problems) >= limit:
            return
        if _is_tensor(e):
            msg = _tensor_problem(p, e, g, rtol, atol)
            if msg:
                problems.append(msg)
        elif isinstance(e, bool) or e is None or isinstance(e, str):
            if type(g) is not type(e) or g != e:
                problems.append(f"{p}: expected {e!r}, got {_kind(g)}")
        elif isinstance(e, int):
            if isinstance(g, bool) or not isinstance(g, (int, float)) or g != e:
                problems.append(f"{p}: expected {e}, got {_kind(g)}")
        elif isinstance(e, float):
            if isinstance(g, bool) or not isinstance(g, (int, float)):
                problems.append(f"{p}: expected a number close to {_fmt(e)}, got {_kind(g)}")
            elif not (abs(g - e) <= atol + rtol * abs(e)) or (math.isnan(g) and not math.isnan(e)):
                problems.append(f"{p}: expected {_fmt(e)}, got {_fmt(float(g))} (rtol={rtol:g}, atol={atol:g})")
        elif isinstance(e, (list, tuple)):
            if not isinstance(g, (list, tuple)):
                problems.append(f"{p}: expected a {type(e).__name__} of {len(e)}, got {_kind(g)}")
            elif type(g) is not type(e):
                problems.append(f"{p}: expected a {type(e).__name__}, got a {type(g).__name__}")
            elif len(g) != len(e):
                problems.append(f"{p}: expected {len(e)} items, got {len(g)}")
            else:
                for i, (ei, gi) in enumerate(zip(e, g)):
                    walk(ei, gi, f"{p}[{i}]")
        elif isinstance(e, dict):
            if not isinstance(g, dict) or _is_tensor(g):
                problems.append(f"{p}: expected a dict, got {_kind(g)}")
            else:
                for k in e:
                    where = k if p == "output" else f"{p}[{k!r}]"
                    if k in g:
                        walk(e[k], g[k], where)
                    elif len(problems) < limit:
                        problems.append(f"{where}: missing")
                extra = sorted(set(g) - set(e))
                if extra and len(problems) < limit:
                    problems.append(f"{p}: unexpected keys {extra}")
        else:
            problems.append(f"{p}: cannot compare {type(e).__name__}")

    walk(expected, got, path)
    first = next((i for i, m in enumerate(problems) if m.endswith(META_NOTE)), None)
    return [m[: -len(META_NOTE)] if m.endswith(META_NOTE) and i != first else m for i, m in enumerate(problems)]


def expect_like(obj: Any, device: str) -> Any:
    """The expected observation of `obj` moved to `device`: its tensors via expect_tensor, the rest as is."""
    if isinstance(obj, torch.Tensor):
        return expect_tensor(obj, device)
    if isinstance(obj, (list, tuple)):
        items = [expect_like(v, device) for v in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        return {str(k): expect_like(v, device) for k, v in obj.items()}
    return obj
