"""Feedback for the exercises: `check.NAME(fn)` runs a student's function on a few visible cases
and prints what is wrong (shape, dtype, device, which elements differ), returning True or False.

It never raises, so a check cell runs (under nbval too) before the student has written anything.
The callers and `compare` below are shared with the autograder (`labkit grade`), which runs the
same callers on hidden cases in a separate process and compares in the parent.
"""
from __future__ import annotations

import math
import os
import time
import traceback
from typing import Any, Callable

import torch

# ---------------------------------------------------------------------------------------------
# Observations: what a call produced, as plain data (tensors on the CPU, devices as strings), so
# it can travel from the grading child to the parent through torch.save / torch.load(weights_only).


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


# ---------------------------------------------------------------------------------------------
# Callers: how each exercise function is called for one case. `args` is plain data (CPU tensors,
# numbers, strings); a caller builds the real arguments, calls `fn`, and returns an observation.

def _dev(args: dict) -> torch.device:
    return torch.device(args.get("device", "cpu"))


def _make_mlp(sizes: list[int], state: dict, device: torch.device) -> torch.nn.Module:
    a, b, c = sizes
    model = torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.Tanh(), torch.nn.Linear(b, c))
    model.load_state_dict(state)
    return model.to(device)


def _view(t: torch.Tensor, view: str | None) -> torch.Tensor:
    """A non-contiguous view, made on the tensor's own device."""
    if view == "cols_step2":
        return t[:, ::2]
    if view == "transposed":
        return t.t()
    if view == "row_slice":
        return t[:, 1:-1]
    return t


def call_causal_mask(fn, args):
    if args.get("device") == "meta":  # meta has no values: also run the same input on the CPU
        return {"result on meta": snapshot(fn(args["x"].to("meta"))),
                "values (same input on the cpu)": snapshot(fn(args["x"]))}
    return snapshot(fn(args["x"].to(_dev(args))))


def expect_mask(t: int, device: str) -> Any:
    """The expected observation of causal_mask for a (.., t, ..) input on `device`."""
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    if device == "meta":
        return {"result on meta": expect_tensor(mask, "meta"), "values (same input on the cpu)": expect_tensor(mask, "cpu")}
    return expect_tensor(mask, device)


def call_to_device(fn, args):
    model = _make_mlp(args["sizes"], args["state"], torch.device("cpu"))
    device = args["device"] if args.get("as_string") else torch.device(args["device"])
    out = fn(model, args["batch"], device)
    pair = isinstance(out, (tuple, list)) and len(out) == 2
    return {"returns (model, batch)": pair,
            "returns the same model object (moved in place)": pair and out[0] is model,
            "model parameters": snapshot(list(model.parameters())),
            "batch": snapshot(out[1]) if pair else None}


def call_pinned_copy(fn, args):
    x = _view(args["x"], args.get("view"))
    before = x.clone()
    out = fn(x)
    obs = {"copy": snapshot(out), "x left unchanged": bool(torch.equal(x, before))}
    if isinstance(out, torch.Tensor):
        obs["page-locked (pinned) when CUDA is available"] = bool(out.is_pinned())
        obs["contiguous"] = out.is_contiguous()
        obs["a separate copy (shares no memory with x)"] = (
            out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr())
    return obs


OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "affine": lambda t: t * 2.0 + 1.0,
    "sin_square": lambda t: torch.sin(t) * t,
}


def call_overlapped_map(fn, args):
    out = fn(list(args["chunks"]), OPS[args["op"]], _dev(args))
    if _dev(args).type == "cuda":
        torch.cuda.synchronize()
    return {"outputs": snapshot(list(out) if isinstance(out, tuple) else out)}


# Bound when labkit.check is imported (the grader imports it before any student code runs), so a
# submission that patches torch.cuda cannot change how the graded GPU workload is sized.
_SLEEP = getattr(torch.cuda, "_sleep", None)
_EVENT = torch.cuda.Event
_ELAPSED = torch.cuda.Event.elapsed_time
_RECORD = torch.cuda.Event.record
_SYNC = torch.cuda.synchronize
_gpu_cycles_per_ms: float | None = None


def _time_sleep_ms(cycles: int) -> float:
    start, end = _EVENT(enable_timing=True), _EVENT(enable_timing=True)
    _RECORD(start)
    _SLEEP(cycles)
    _RECORD(end)
    _SYNC()
    return _ELAPSED(start, end)


def calibrate_gpu_sleep(target_ms: float = 3.0) -> float:
    """GPU clock cycles per millisecond of `torch.cuda._sleep`, measured now with CUDA events.

    The GPU's clock moves with its load, so this is measured again right before each timed case
    (sleeps of about `target_ms`, after a warm-up sleep), not once per process.
    """
    global _gpu_cycles_per_ms
    if _gpu_cycles_per_ms is None:
        _SLEEP(1000)
        _gpu_cycles_per_ms = 5_000_000 / max(_time_sleep_ms(5_000_000), 1e-3)
    cycles = max(1000, int(_gpu_cycles_per_ms * target_ms))
    _time_sleep_ms(cycles)  # warm-up at the load the case will run under
    per_ms = sorted(cycles / max(_time_sleep_ms(cycles), 1e-3) for _ in range(3))[1]
    _gpu_cycles_per_ms = per_ms
    return per_ms


def call_median_ms(fn, args):
    """fn is timed on a callable whose first `warmup` calls are slow and one timed call is an outlier."""
    device = _dev(args)
    ms, warmup, reps = float(args["ms"]), int(args["warmup"]), int(args["reps"])
    slow_calls = set(range(warmup)) | {warmup + int(args["outlier_at"])}
    calls = [0]
    if device.type == "cuda":
        per_ms = calibrate_gpu_sleep(ms)
        sleep = _SLEEP

        def work():
            sleep(int(per_ms * ms * (10 if calls[0] in slow_calls else 1)))
            calls[0] += 1
    else:
        def work():
            time.sleep(ms * (10 if calls[0] in slow_calls else 1) / 1e3)
            calls[0] += 1
    out = fn(work, device, warmup=warmup, reps=reps)
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        out = out.item()
    return {"median (ms)": snapshot(out), "calls of fn": calls[0]}


def call_matmul_flops_bytes(fn, args):
    out = fn(args["m"], args["n"], args["k"], args["itemsize"])
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        return {"returns (flops, bytes)": False}
    return {"returns (flops, bytes)": True, "FLOPs": snapshot(out[0]), "bytes": snapshot(out[1])}


def call_attainable_tflops(fn, args):
    out = fn(args["flops"], args["nbytes"], args["peak_tflops"], args["peak_gbps"])
    return {"attainable TFLOP/s": snapshot(out)}


def call_row_sum(fn, args):
    x = _view(args["x"].to(_dev(args)), args.get("view"))
    return snapshot(fn(x))


def call_scale_kernel_source(fn, args):
    return {"source": snapshot(fn())}


def call_found_inf(fn, args):
    grads = [None if g is None else g.to(_dev(args)) for g in args["grads"]]
    out = fn(grads)
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        out = out.item()
    return {"found inf or nan": snapshot(out)}


def call_update_scale(fn, args):
    scale, tracker, seen = args["scale"], 0, []
    for found in args["found_inf"]:
        out = fn(scale, found, tracker, growth_factor=args["growth_factor"],
                 backoff_factor=args["backoff_factor"], growth_interval=args["growth_interval"])
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            seen.append(snapshot(out))
            break
        scale, tracker = out
        seen.append((snapshot(scale), snapshot(tracker)))
    return {"(scale, growth_tracker) after each step": seen}


def call_average_gradients(fn, args):
    grads = [[g.to(_dev(args)) for g in rank] for rank in args["grads"]]
    return {"averaged gradients": snapshot(fn(grads))}


def call_accumulated_grads(fn, args):
    device = _dev(args)
    model = _make_mlp(args["sizes"], args["state"], device)
    for p in model.parameters():  # stale gradients from an earlier step must not leak in
        p.grad = torch.ones_like(p)
    rows: list[int] = []
    model.register_forward_pre_hook(lambda mod, inp: rows.append(int(inp[0].shape[0])))
    out = fn(model, args["x"].to(device), args["y"].to(device), args["micro_batch"])
    return {"gradients": snapshot(list(out) if isinstance(out, tuple) else out),
            "every forward pass used at most micro_batch rows": bool(rows) and max(rows) <= args["micro_batch"]}


CALLERS: dict[str, Callable[[Callable, dict], Any]] = {
    name[len("call_"):]: f for name, f in dict(globals()).items() if name.startswith("call_")
}

# ---------------------------------------------------------------------------------------------
# CUDA: the instructor's host wrapper around a student's `scale_kernel` (exercise 06).

SCALE_KERNEL_HEADER = """#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>
#include <limits>
"""
SCALE_WRAPPER = """
torch::Tensor scale(torch::Tensor x, double alpha) {
    TORCH_CHECK(x.is_cuda(), "scale: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "scale: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "scale: x must be contiguous");
    auto out = torch::full_like(x, std::numeric_limits<float>::quiet_NaN());  // unwritten -> NaN
    const int64_t n = x.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    if (n > 0) {
        scale_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            x.data_ptr<float>(), out.data_ptr<float>(), static_cast<float>(alpha), n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return out;
}
"""


_built: dict[str, Any] = {}


def build_scale_extension(kernel_source: str, name: str | None = None, build_dir: str | None = None,
                          verbose: bool = False):
    """Compile a student's `scale_kernel` with the host wrapper; the module has `scale(x, alpha)`.

    Without a name, the module is named after the source (so a rebuild of the same code is a no-op)
    and kept for this process.
    """
    import zlib

    from torch.utils.cpp_extension import load_inline

    key = None if name or build_dir else kernel_source
    if key is not None and key in _built:
        return _built[key]
    name = name or f"labkit_scale_{zlib.crc32(kernel_source.encode()):08x}"
    if build_dir:
        os.makedirs(build_dir, exist_ok=True)
    module = load_inline(name=name, cpp_sources="torch::Tensor scale(torch::Tensor x, double alpha);",
                         cuda_sources=SCALE_KERNEL_HEADER + kernel_source + SCALE_WRAPPER,
                         functions=["scale"], build_directory=build_dir, verbose=verbose,
                         extra_cuda_cflags=["-O2"])
    if key is not None:
        _built[key] = module
    return module


def have_cuda_toolchain() -> bool:
    """A CUDA GPU that PyTorch sees and an nvcc to build extensions with."""
    import shutil
    if not torch.cuda.is_available():
        return False
    if shutil.which("nvcc"):
        return True
    from torch.utils.cpp_extension import CUDA_HOME
    return bool(CUDA_HOME) and os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc"))


# ---------------------------------------------------------------------------------------------
# Visible cases. Expected values come from simple float64 references on fixed seeds, or, for the
# exercises whose reference would be the answer itself, from numbers worked out by hand.

def _here() -> torch.device:
    from labkit.device import current
    return current().device


def _mlp_args(g: torch.Generator, sizes: list[int]) -> tuple[dict, torch.nn.Module]:
    a, b, c = sizes
    ref = torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.Tanh(), torch.nn.Linear(b, c))
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return {k: v.clone() for k, v in ref.state_dict().items()}, ref


def _visible_causal_mask() -> list[dict]:
    g = torch.Generator().manual_seed(1)
    devices = [str(_here())] + (["meta"] if _here().type == "cpu" else [])
    cases = []
    for dev in devices:
        x = torch.randn(2, 5, 3, generator=g)
        cases.append({"about": f"x of shape (2, 5, 3) on {dev}", "args": {"x": x, "device": dev},
                      "expected": expect_mask(5, dev)})
    return cases


def _visible_to_device() -> list[dict]:
    g = torch.Generator().manual_seed(2)
    target = "cuda" if _here().type == "cuda" else "meta"
    state, _ = _mlp_args(g, [3, 4, 2])
    batch = {"x": torch.randn(5, 3, generator=g), "y": torch.arange(5), "name": "batch0"}
    exp_batch = {"x": expect_tensor(batch["x"], target), "y": expect_tensor(batch["y"], target), "name": "batch0"}
    params = [expect_tensor(state[k], target) for k in ("0.weight", "0.bias", "2.weight", "2.bias")]
    return [{"about": f"an MLP and a dict batch moved to {target}",
             "args": {"sizes": [3, 4, 2], "state": state, "batch": batch, "device": target},
             "expected": {"returns (model, batch)": True, "returns the same model object (moved in place)": True,
                          "model parameters": params, "batch": exp_batch}}]


def _visible_pinned_copy() -> list[dict]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 4, generator=g)
    return [{"about": "x of shape (6, 4) float32",
             "args": {"x": x}, "expected": _pinned_expect(x)}]


def _pinned_expect(x: torch.Tensor) -> dict:
    return {"copy": expect_tensor(x.contiguous(), "cpu"), "x left unchanged": True,
            "page-locked (pinned) when CUDA is available": torch.cuda.is_available(),
            "contiguous": True, "a separate copy (shares no memory with x)": True}


def _visible_overlapped_map() -> list[dict]:
    g = torch.Generator().manual_seed(4)
    chunks = [torch.randn(1000, generator=g) for _ in range(3)]
    dev = str(_here())
    return [{"about": f"3 chunks of 1000 floats, fn = t * 2 + 1, on {dev}",
             "args": {"chunks": chunks, "op": "affine", "device": dev},
             "expected": {"outputs": [expect_tensor(OPS["affine"](c.double()).float(), dev) for c in chunks]},
             "rtol": 1e-6, "atol": 1e-6}]


def _visible_median_ms() -> list[dict]:
    dev = str(_here())
    return [{"about": f"a {dev} function taking about 3 ms (10x slower on its first 2 calls, and once later)",
             "args": {"device": dev, "ms": 3.0, "warmup": 2, "reps": 5, "outlier_at": 3},
             "expected": {"median (ms)": 3.0, "calls of fn": 7}, "rtol": 0.3, "atol": 0.5}]


def _visible_matmul_flops_bytes() -> list[dict]:
    # worked by hand: 2*m*n*k FLOPs; (m*k + k*n + m*n) elements read or written once.
    return [{"about": "m=2, n=3, k=4, fp32", "args": {"m": 2, "n": 3, "k": 4, "itemsize": 4},
             "expected": {"returns (flops, bytes)": True, "FLOPs": 48, "bytes": 104}},
            {"about": "m=n=k=1024, bf16", "args": {"m": 1024, "n": 1024, "k": 1024, "itemsize": 2},
             "expected": {"returns (flops, bytes)": True, "FLOPs": 2147483648, "bytes": 6291456}}]


def _visible_attainable_tflops() -> list[dict]:
    # worked by hand: intensity 1 FLOP/B * 1000 GB/s = 1 TFLOP/s (bandwidth-bound);
    # intensity 1000 FLOP/B * 1000 GB/s = 1000 TFLOP/s > 50, so compute-bound at 50.
    return [{"about": "1e9 FLOPs over 1e9 bytes, 50 TFLOP/s, 1000 GB/s",
             "args": {"flops": 1e9, "nbytes": 1e9, "peak_tflops": 50.0, "peak_gbps": 1000.0},
             "expected": {"attainable TFLOP/s": 1.0}, "rtol": 1e-9},
            {"about": "1e12 FLOPs over 1e9 bytes, 50 TFLOP/s, 1000 GB/s",
             "args": {"flops": 1e12, "nbytes": 1e9, "peak_tflops": 50.0, "peak_gbps": 1000.0},
             "expected": {"attainable TFLOP/s": 50.0}, "rtol": 1e-9}]


def _visible_row_sum() -> list[dict]:
    g = torch.Generator().manual_seed(5)
    dev = str(_here())
    x = torch.randn(4, 37, generator=g)
    return [{"about": f"x of shape (4, 37) float32 on {dev}", "args": {"x": x, "device": dev},
             "expected": expect_tensor(x.double().sum(1).float(), dev), "rtol": 1e-4, "atol": 1e-4}]


def _visible_found_inf() -> list[dict]:
    dev = str(_here())
    ok = [torch.ones(3, 2), None, torch.full((5,), 2.0)]
    bad = [torch.ones(3, 2), torch.tensor([1.0, float("inf")]).half()]
    nan = [torch.tensor([float("nan"), 0.0])]
    return [{"about": "finite gradients (one is None)", "args": {"grads": ok, "device": dev},
             "expected": {"found inf or nan": False}},
            {"about": "an inf in an fp16 gradient", "args": {"grads": bad, "device": dev},
             "expected": {"found inf or nan": True}},
            {"about": "a NaN", "args": {"grads": nan, "device": dev}, "expected": {"found inf or nan": True}}]


def _visible_update_scale() -> list[dict]:
    # worked by hand, growth_interval=2: ok, ok -> grow to 2048; inf -> back off to 1024; ok; inf -> 512
    return [{"about": "scale 1024, growth_interval 2, steps: ok, ok, inf, ok, inf",
             "args": {"scale": 1024.0, "found_inf": [False, False, True, False, True], "growth_factor": 2.0,
                      "backoff_factor": 0.5, "growth_interval": 2},
             "expected": {"(scale, growth_tracker) after each step":
                          [(1024.0, 1), (2048.0, 0), (1024.0, 0), (1024.0, 1), (512.0, 0)]}}]


def _visible_average_gradients() -> list[dict]:
    g = torch.Generator().manual_seed(6)
    dev = str(_here())
    grads = [[torch.randn(3, 2, generator=g), torch.randn(4, generator=g)] for _ in range(3)]
    mean = [torch.stack([r[i].double() for r in grads]).mean(0).float() for i in range(2)]
    return [{"about": f"3 ranks, 2 parameters, on {dev}", "args": {"grads": grads, "device": dev},
             "expected": {"averaged gradients": [expect_tensor(m, dev) for m in mean]},
             "rtol": 1e-6, "atol": 1e-6}]


def _visible_accumulated_grads() -> list[dict]:
    g = torch.Generator().manual_seed(7)
    dev = str(_here())
    state, _ = _mlp_args(g, [3, 5, 2])
    x, y = torch.randn(8, 3, generator=g), torch.randn(8, 2, generator=g)
    return [{"about": f"a batch of 8 in micro-batches of 4, on {dev}",
             "args": {"sizes": [3, 5, 2], "state": state, "x": x, "y": y, "micro_batch": 4, "device": dev},
             "expected": accumulated_grads_expect([3, 5, 2], state, x, y, dev),
             "rtol": 1e-4, "atol": 1e-5}]


def accumulated_grads_expect(sizes: list[int], state: dict, x: torch.Tensor, y: torch.Tensor, dev: str) -> dict:
    """Full-batch gradients of the mean squared error, in float64, as the expected observation."""
    ref = _make_mlp(sizes, state, torch.device("cpu")).double()
    torch.nn.functional.mse_loss(ref(x.double()), y.double()).backward()
    return {"gradients": [expect_tensor(p.grad.float(), dev) for p in ref.parameters()],
            "every forward pass used at most micro_batch rows": True}


VISIBLE: dict[str, Callable[[], list[dict]]] = {
    name[len("_visible_"):]: f for name, f in dict(globals()).items() if name.startswith("_visible_")
}

# ---------------------------------------------------------------------------------------------
# The checks students call.


def _where(exc: BaseException) -> str:
    """The last line of the student's own code in a traceback (not torch's, not labkit's)."""
    skip = (os.path.dirname(torch.__file__), os.path.dirname(__file__), "site-packages", "/lib/python")
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not any(s in frame.filename for s in skip):
            return f" (in {frame.name}, line {frame.lineno}: {(frame.line or '').strip()[:80]})"
    return ""


def describe_error(exc: BaseException) -> str:
    """One line for a student about an exception their code raised."""
    if isinstance(exc, NotImplementedError):
        return f"not done yet: {exc}" if str(exc) else "not done yet"
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"raised {type(exc).__name__}{': ' + text if text else ''}{_where(exc)}"


def run_check(name: str, fn: Any, cases: list[dict] | None = None) -> bool:
    """Run `fn` on the visible cases of exercise `name`; print one verdict; never raise."""
    if not callable(fn):
        print(f"✗ {name}: expected a function, got {type(fn).__name__}")
        return False
    try:
        cases = VISIBLE[name]() if cases is None else cases
    except Exception as exc:  # e.g. labkit.setup() chose a device this check cannot use
        print(f"✗ {name}: could not make the check's inputs: {describe_error(exc)}")
        return False
    for case in cases:
        try:
            got = CALLERS[name](fn, case["args"])
        except Exception as exc:
            mark = "…" if isinstance(exc, NotImplementedError) else "✗"
            print(f"{mark} {name}: {describe_error(exc)}" + ("" if mark == "…" else f"\n  on {case['about']}"))
            return False
        problems = compare(case["expected"], got, case.get("rtol", 0.0), case.get("atol", 0.0))
        if problems:
            print(f"✗ {name}, on {case['about']}:\n  " + "\n  ".join(problems))
            return False
    print(f"✓ {name}: {len(cases)} visible check{'s' if len(cases) > 1 else ''} passed "
          f"(the grader also tries other sizes, dtypes and seeds)")
    return True


def _make_check(name: str) -> Callable[[Any], bool]:
    def check(fn: Any) -> bool:
        return run_check(name, fn)
    check.__name__ = name
    check.__doc__ = f"Check your `{name}` on a few visible cases; prints what is wrong, returns True if all pass."
    return check


for _name in CALLERS:
    if _name != "scale_kernel_source":
        globals()[_name] = _make_check(_name)


def scale_kernel_source(fn: Any) -> bool:
    """Check the CUDA kernel source: build and run it on a GPU; without one, say so in one line."""
    name = "scale_kernel_source"
    try:
        src = fn()
    except Exception as exc:
        print(f"{'…' if isinstance(exc, NotImplementedError) else '✗'} {name}: {describe_error(exc)}")
        return False
    if not isinstance(src, str) or "__global__" not in src or "scale_kernel" not in src:
        print(f"✗ {name}: expected a string of CUDA C defining `__global__ void scale_kernel(...)`, "
              f"got {type(src).__name__}")
        return False
    if not have_cuda_toolchain():
        print(f"[skipped on this machine] {name}: building and running a CUDA kernel needs a GPU and nvcc "
              f"(the grader marks it 'needs GPU' on a machine without them).")
        return False
    try:
        ext = build_scale_extension(src)
    except Exception as exc:
        lines = [ln for ln in str(exc).splitlines() if "error" in ln.lower()][:5]
        print(f"✗ {name}: the kernel did not compile:\n  " + "\n  ".join(lines or [str(exc)[:300]]))
        return False
    g = torch.Generator().manual_seed(8)
    cases = []
    for n in (1, 257, 10_000):
        x = torch.randn(n, generator=g)
        cases.append({"about": f"n={n}, alpha=1.5", "args": {"x": x, "alpha": 1.5},
                      "expected": expect_tensor((x.double() * 1.5).float(), "cuda"), "rtol": 1e-6, "atol": 1e-6})
    for case in cases:
        try:
            got = snapshot(ext.scale(case["args"]["x"].cuda(), case["args"]["alpha"]))
            torch.cuda.synchronize()
        except Exception as exc:
            print(f"✗ {name}: {describe_error(exc)}\n  on {case['about']}")
            return False
        problems = compare(case["expected"], got, case["rtol"], case["atol"])
        if problems:
            print(f"✗ {name}, on {case['about']}:\n  " + "\n  ".join(problems))
            return False
    print(f"✓ {name}: built and ran on {len(cases)} sizes (unwritten elements would show as NaN)")
    return True
