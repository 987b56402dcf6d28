"""Launching labkit's Triton kernels without Triton's per-call argument binding (issue 39).

`kernel[grid](*args, **meta)` binds the arguments, specialises each one, builds a cache key string and looks up
the compiled kernel on every call: profiled on an H100 host, the largest Python cost of a labkit layer norm
forward+backward (issue 39). A Launcher does that once per kind of call: it keys the compiled kernel on what
Triton specialises on (`spec`: each tensor's dtype and 16-byte alignment, each integer's divisibility by 16,
being 1 and width; the constexprs and options; the current device), computed by a function generated per pattern
of argument types (`binder`), then launches it through PyTorch's C++ static launcher (the one Inductor uses;
measured on an H100 host: 3.4 us a launch with its arguments ready, against 5.5 us through Triton's compiled
launcher), or Triton's compiled launcher where that one cannot. Anything it does not
recognise (the interpreter, torch.compile tracing, hooks, debug or instrumentation knobs, a changed global,
another Triton's launcher) goes through `kernel[grid]` as before. `LABKIT_FAST_LAUNCH=0` in the environment, or
ENABLED = False at run time, sends every launch there (to compare).
"""
from __future__ import annotations

import os
from collections.abc import Callable

import torch

from labkit import compat

# (a Triton without these: every launch takes kernel[grid])
_JITFunction, _knobs, _HookChain = compat.triton_launch() or (None, None, None)

ENABLED = os.environ.get("LABKIT_FAST_LAUNCH", "1") != "0"
MAX_ENTRIES = 4096  # compiled launches remembered per kernel (emptied past that)


def _int_spec(a: int) -> tuple:
    """An integer's divisibility by 16, being 1, and its width (i32, i64, u64)."""
    return a % 16 == 0, a == 1, -2**31 <= a < 2**31, a >= 2**63


def spec(a: object) -> object:
    """What Triton specialises an argument on: a tensor's dtype and 16-byte alignment; an integer's divisibility
    by 16, being 1 and its type (i32, i64, u64); a TMA descriptor's dtype, block, padding, TF32 rounding, layout
    and base alignment; a tuple's elements; a float's, a bool's or None's type (not specialised on the value);
    any other object itself."""
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if a is None or isinstance(a, (bool, float)):
        return type(a)
    if isinstance(a, int):
        return _int_spec(a)
    if isinstance(a, tuple):  # Triton specialises each element
        return type(a), tuple(spec(x) for x in a)
    base = getattr(a, "base", None)
    if isinstance(base, torch.Tensor) and hasattr(a, "block_shape"):  # TensorDescriptor (and Gluon's)
        return (type(a), base.dtype, base.data_ptr() % 16 == 0, tuple(a.block_shape), getattr(a, "padding", None),
                getattr(a, "round_f32_to_tf32", None), getattr(a, "layout", None))
    try:  # anything else: the object itself (finer than Triton's key is safe), or a key no later call has
        hash(a)
        return type(a), a
    except TypeError:
        return object()


def binder(kinds: tuple[type, ...]) -> Callable[[tuple], tuple[tuple, tuple]]:
    """A function of arguments of these types, in order, to (key, values): key tells apart whatever Triton
    specialises apart, as `spec` does (a tensor's dtype; whether all tensors are on a GPU and all are 16-byte aligned,
    else each one's alignment; an integer's divisibility, being 1 and width; a float's or a bool's type; anything
    else's spec), and values are the arguments with each tensor replaced by its data pointer. Generated once per
    pattern of types, so a call costs one flat expression, not a dispatch per argument."""
    names = [f"a{i}" for i in range(len(kinds))]
    tensors = [n for n, k in zip(names, kinds) if k is _Tensor]
    key, values = [], []
    for n, k in zip(names, kinds):
        if k is _Tensor:
            key.append(f"{n}.dtype")
            values.append(f"p{n}")
        elif k is int:  # 1 < a < 2**31: only the divisibility is left to tell
            key.append(f"({n} & 15 == 0 if 1 < {n} < 2147483648 else _int_spec({n}))")
            values.append(n)
        elif k is float or k is bool:
            key.append("_" + k.__name__)
            values.append(n)
        else:
            key.append(f"_spec({n})")
            values.append(n)
    if tensors:
        ptrs = " | ".join(f"p{n}" for n in tensors)
        key.append(" and ".join(f"{n}.is_cuda" for n in tensors))
        key.append(f"not ({ptrs}) & 15 or ({', '.join(f'p{n} & 15 == 0' for n in tensors)},)")
    def tup(items: list[str]) -> str:
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    lines = ["def bind(args):", f"    {tup(names)} = args"]
    lines += [f"    p{n} = {n}.data_ptr()" for n in tensors]
    lines.append(f"    return {tup(key)}, {tup(values)}")
    scope = {"_int_spec": _int_spec, "_spec": spec, "_float": float, "_bool": bool}
    exec("\n".join(lines), scope)  # noqa: S102 (source built above from argument positions only)
    return scope["bind"]


_Tensor = torch.Tensor
# torch.compile traces kernel[grid] into its graph (Triton kernels it knows); the direct launch it could not.
_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
# PyTorch's C++ launcher of compiled Triton kernels (the one Inductor uses), or None: Triton's own launcher then.
_static_launch = compat.static_cuda_launch()
# Triton's argument types (the compiled signature) as the static launcher's one-letter codes ("O": a pointer)
_ARG_CODE = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B", "u16": "H", "u32": "I",
             "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f", "f32": "f", "fp64": "d"}


def _quiet(hook: object) -> bool:
    return hook is None or (type(hook) is _HookChain and not hook.calls)


def _plain_knobs() -> bool:
    """Whether Triton's launch would do nothing beyond binding and launching: no launch hooks, no debug or
    instrumentation mode, no pipeline-inspection hook."""
    rt = _knobs.runtime
    return (not rt.debug and _quiet(rt.launch_enter_hook) and _quiet(rt.launch_exit_hook)
            and getattr(rt, "add_stages_inspection_hook", None) is None
            and not _knobs.compilation.instrumentation_mode)


class Launcher:
    """A Triton kernel's compiled launches, cached by what Triton specialises on.

    launcher.launch(grid, args, meta): args the kernel's runtime arguments in order, meta its constexprs (after
    every runtime argument in the kernel's signature) and options (num_warps, num_stages...) by name, as
    `kernel[grid](*args, **meta)` takes them. launcher(grid, args, constexprs, **options) is the same.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled: dict = {}
        # Only a plain @triton.jit kernel (not the interpreter's, not an autotuner) takes the fast path.
        self.disabled = _JITFunction is None or not isinstance(kernel, _JITFunction)
        self._device = self._stream = None
        self._run_fn, self._run_ok, self._recording = None, False, None
        self._binders: dict[tuple, Callable] = {}
        self.watch: tuple = ()  # the globals the kernel reads, with their values when compiled (Triton's check)

    def __call__(self, grid: tuple, args: tuple, constexprs: dict, **options) -> None:
        self.launch(grid, args, {**constexprs, **options})

    def launch(self, grid: tuple, args: tuple, meta: dict) -> None:
        key = None
        if ENABLED and not self.disabled and not _compiling() and _plain_knobs() and self._triton_run():
            if self._device is None:
                self._device, self._stream = compat.triton_device_and_stream()
            kinds = tuple(map(type, args))
            bind = self._binders.get(kinds)
            if bind is None:
                bind = self._binders[kinds] = binder(kinds)
            spec_key, values = bind(args)
            device = self._device()
            key = (device, kinds, *meta.items(), spec_key)
            entry = self.compiled.get(key)
            if entry is not None and (not self.watch or self._globals_unchanged()):
                n = len(grid)
                gy, gz = grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
                if entry[0] is None:  # PyTorch's static launcher: pointers as integers, constexprs dropped
                    _, function, warps, shared, codes, keep, extra = entry
                    _static_launch(function, grid[0], gy, gz, warps, shared, codes,
                                   (values if keep is None else tuple(values[i] for i in keep)) + extra,
                                   self._stream(device))
                    return
                run, function, packed, consts = entry
                try:  # the arguments Triton's own launch passes: grid, stream, kernel, metadata, no hooks, all args
                    run(grid[0], gy, gz, self._stream(device), function, packed, None, None, None, *args, *consts)
                    return
                except TypeError:  # a launcher that takes other arguments (fails before launching): Triton's path
                    self.compiled.clear()
                    self.disabled = True
                    key = None
        compiled = self.kernel[grid](*args, **meta)
        if key is not None:
            self._remember(key, compiled, len(args), meta)

    def _triton_run(self) -> bool:
        """Whether the kernel's `run` is Triton's own, or a wrapper that is not recording now: a wrapped run
        (labkit.exercises.launches records launches, a profiler counts them) must see every launch while it
        records, so then each one takes kernel[grid]. A wrapper says when it records through its
        `labkit_recording()`; one that does not say is taken to record always."""
        run = type(self.kernel).run
        if run is not self._run_fn:
            self._run_fn, self._run_ok = run, getattr(run, "__module__", "").startswith("triton.")
            self._recording = None if self._run_ok else getattr(run, "labkit_recording", None)
        return self._run_ok or (self._recording is not None and not self._recording())

    def _globals_unchanged(self) -> bool:
        """Whether every global the kernel read when compiled still has that value (else Triton's path raises)."""
        missing = object()
        return all(scope.get(name, missing) == value for (name, _), (value, scope) in self.watch)

    def _remember(self, key: tuple, compiled: object, n_args: int, meta: dict) -> None:
        """Keep `compiled` for `key` if launching it directly is what Triton's own launch would do."""
        kernel = self.kernel
        if kernel.pre_run_hooks:  # Triton runs them before each launch
            self.disabled = True
            return
        self.watch = tuple(kernel.used_global_vals.items())
        params = kernel.params
        if (compiled is None or hasattr(compiled, "result") or not hasattr(compiled, "packed_metadata")
                or any(p.is_constexpr for p in params[:n_args])
                or not all(p.is_constexpr and p.name in meta for p in params[n_args:])):
            return  # not a compiled kernel, or constexprs not last, or one left at its default: Triton's path
        run = compiled.run  # (loads the kernel onto the GPU on first use)
        if len(self.compiled) >= MAX_ENTRIES:
            self.compiled.clear()
        self.compiled[key] = (static_entry(compiled, params[:n_args]) or
                              (run, compiled.function, compiled.packed_metadata,
                               tuple(meta[p.name] for p in params[n_args:])))


def static_entry(compiled: object, params: list) -> tuple | None:
    """(None, kernel handle, warps, shared memory, argument codes, kept positions or None for all, trailing
    arguments) to launch `compiled` through PyTorch's static launcher, or None where that launcher would not do
    what Triton's does: no such launcher, several CTAs, a cooperative or PDL launch, scratch memory, tensor
    descriptors, or an argument type it does not know."""
    md = getattr(compiled, "metadata", None)
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    if (_static_launch is None or md is None or not isinstance(signature, dict) or getattr(md, "num_ctas", 1) != 1
            or getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False)
            or getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0)
            or getattr(md, "tensordesc_meta", None) or not isinstance(getattr(compiled, "function", None), int)):
        return None
    types = [signature.get(p.name) for p in params]
    keep = [i for i, t in enumerate(types) if t != "constexpr"]
    codes = ["O" if isinstance(types[i], str) and types[i].startswith("*") else _ARG_CODE.get(types[i])
             for i in keep]
    if None in codes:
        return None
    # Triton appends a global and a profile scratch pointer to the kernel's parameters where its metadata has them
    extra = tuple(None for name in ("global_scratch_size", "profile_scratch_size") if hasattr(md, name))
    return (None, compiled.function, md.num_warps, md.shared, "".join(codes) + "O" * len(extra),
            None if len(keep) == len(types) else tuple(keep), extra)
