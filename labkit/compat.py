"""Every private or experimental PyTorch and Triton API labkit uses, in one place, each behind a guard.

PyTorch and Triton may rename or remove these in any release; the locked pairs (locks/torch.toml) have them
all, and `python3 course.py test --latest` shows what the newest releases changed. No other labkit module
touches them (tests/test_compat.py checks), except the Gluon kernel itself (kernels/matmul_tf32.py), which is
written in Gluon and is loaded only through `gluon_matmul()`.

Each hook: what labkit uses it for; what happens without it.
- `triton.experimental.gluon` (kernels/matmul_tf32.py): TF32 matmul on Hopper without copying B; without it,
  the TMA kernel, with one warning.
- `triton.tools.tensor_descriptor.TensorDescriptor`: host-side TMA descriptors (matmul); the pointer kernel.
- `triton.runtime.driver.active.utils.get_device_properties`: a GPU's shared memory a block; torch's figure.
- `triton.runtime.jit.JITFunction.run`, `triton.runtime.interpreter.InterpretedFunction.run`: the exercises
  see which kernels a call launched; no launch record, and the checks say so.
- `triton.runtime.jit.JITFunction` (its `params`, `pre_run_hooks`, `used_global_vals`), `triton.knobs` (launch
  hooks, debug, instrumentation), `triton.runtime.driver.active.get_current_device`/`get_current_stream`, a
  CompiledKernel's `run`/`function`/`packed_metadata`: labkit.kernels._launch launches a compiled kernel without
  Triton's per-call binding (issue 39); without them, every launch takes `kernel[grid]`, as before.
- `triton.runtime.interpreter` (`_patch_lang_tensor`, `InterpreterBuilder`): labkit.setup() mends the
  interpreter; it runs as Triton has it.
- `torch.cuda._compile_kernel`, `torch.cuda._utils`: the NVRTC cluster kernels (labkit/kernels/cluster/rtc.py); the
  Triton kernels, with one warning.
- `torch._C._cuda_getCurrentRawStream`: the current stream's handle, cheaply; `torch.cuda.current_stream()`.
- `torch._C._cuda_isCurrentStreamCapturing`: whether a CUDA graph is being captured, cheaply (the backward kernels'
  finish_partials); `torch.cuda.is_current_stream_capturing()`.
- `torch._scaled_mm`: FP8 matmuls (labkit.precision); FP8 emulated.
- `torch.cuda._sleep`: a GPU kernel that spins for a number of cycles; those sections skip.
- `torch._dynamo.reset`: a clean torch.compile cache between cases; recompiles pile up.
- `torch._functorch.config.donated_buffer`: compile baselines whose backward retains the graph; as PyTorch
  sets it.
- `torch.utils._python_dispatch.TorchDispatchMode`: counting the ops a call runs (exercise 11); none, it is
  needed.
- `torch.cuda.memory._record_memory_history`, `torch.cuda.memory._snapshot`: the allocator's memory snapshot
  (notebook 11: what holds memory, and which allocation ran out); that section says it cannot run.
- `torch._dynamo.mutation_guard.install_generation_tagging_init`: the grader installs torch.compile's one-time
  patch of `nn.Module.__init__`/`__setstate__` before it pins torch's classes (labkit.exercises.integrity), so an
  honest compile is not taken for tampering; without it, the first compile in a graded notebook is.
- `torch._C._len_torch_function_stack`, `torch._C._len_torch_dispatch_stack`, `torch.autograd._profiler_enabled`:
  the grader sees a torch mode or a profiler a notebook left on (labkit.exercises.integrity); without them, it
  cannot, and says nothing.
- `DistributedDataParallel._get_ddp_logging_data`: the sizes of DDP's gradient buckets (labkit.parallel.ddp_timing);
  one bucket of every gradient assumed.
"""
from __future__ import annotations

import functools
import importlib
import warnings
from types import ModuleType
from typing import Any, Callable

import torch

# --- Triton ---


@functools.lru_cache(maxsize=None)
def gluon_matmul(warn: bool = True) -> ModuleType | None:
    """labkit.kernels.matmul_tf32 (the Gluon TF32 kernel), or None where this Triton cannot load it (no Gluon, or
    a Gluon whose names moved: ImportError, AttributeError, TypeError or any other), with one warning if `warn`."""
    try:
        from triton.experimental import gluon  # noqa: F401  (a Triton without Gluon: no warning, nothing to use)
    except ImportError:
        return None
    try:
        return importlib.import_module("labkit.kernels.matmul_tf32")
    except Exception as exc:  # a renamed Gluon name raises AttributeError at import, not ImportError
        import triton
        if not warn:
            return None
        warnings.warn(f"labkit.matmul: TF32 on Hopper takes the TMA kernel (slower), because this Triton "
                      f"({triton.__version__}) cannot load the Gluon kernel: {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=2)
        return None


def tensor_descriptor() -> type | None:
    """Triton's host-side TMA descriptor class (Triton >= 3.4), or None."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def max_shared_memory(device_index: int) -> int | None:
    """Bytes of shared memory one Triton program may use on a GPU, as Triton's driver reports it (None: unknown)."""
    try:
        import triton
        return int(triton.runtime.driver.active.utils.get_device_properties(device_index)["max_shared_mem"])
    except (AttributeError, KeyError, TypeError, RuntimeError):
        return None


def launch_classes() -> list[type]:
    """Triton's kernel classes whose `run` launches a kernel: compiled (JITFunction) and interpreted."""
    try:
        from triton.runtime import jit
    except ImportError:
        return []
    classes: list[type] = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    except ImportError:  # a Triton without the interpreter
        pass
    return [c for c in classes if callable(getattr(c, "run", None))]


def triton_launch() -> tuple[type, ModuleType, type] | None:
    """(JITFunction, triton.knobs, knobs.HookChain) for labkit.kernels._launch's direct launches, or None where this
    Triton lacks one (then every launch takes kernel[grid])."""
    try:
        from triton import knobs
        from triton.knobs import HookChain
        from triton.runtime.jit import JITFunction
    except ImportError:
        return None
    return JITFunction, knobs, HookChain


def static_cuda_launch() -> Callable[..., Any] | None:
    """PyTorch's C++ launcher of compiled Triton kernels, torch._C._StaticCudaLauncher._launch_kernel (the one
    Inductor uses: function, grid x/y/z, warps, shared bytes, argument codes, arguments, stream), or None: a CPU or
    ROCm build, or a PyTorch without it."""
    if torch.version.hip is not None:
        return None
    return getattr(getattr(torch._C, "_StaticCudaLauncher", None), "_launch_kernel", None)


def triton_device_and_stream() -> tuple[Callable[[], int], Callable[[int], int]]:
    """The functions Triton's own launch calls for the current device's index and its current stream's handle."""
    from triton.runtime import driver

    device = driver.active.get_current_device
    if device is torch.cuda.current_device:  # the same index, without the wrapper (launches come after CUDA's start)
        device = current_device_fn()
    return device, driver.active.get_current_stream


def current_device_fn() -> Callable[[], int]:
    """torch.cuda.current_device without its Python wrapper's lazy-init check (a few tenths of a microsecond a
    call), for calls made once CUDA has started (a tensor on the GPU exists)."""
    return getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def autograd_apply(cls: type) -> Callable[..., Any]:
    """cls.apply for a torch.autograd.Function subclass without setup_context, minus the Python wrapper's per-call
    checks (a few microseconds a call, issue 39): the C++ apply directly, unless a functorch transform (vmap,
    grad...) is active, which takes the wrapper's own path."""
    apply = cls.apply
    raw = getattr(super(torch.autograd.Function, cls), "apply", None)
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    if raw is None or active is None or "setup_context" in vars(cls):
        return apply

    def fast_apply(*args: Any) -> Any:
        return apply(*args) if active() else raw(*args)
    return fast_apply


def triton_interpreter() -> ModuleType | None:
    """triton.runtime.interpreter, whose internals labkit.setup() mends (None: not there)."""
    try:
        from triton.runtime import interpreter
    except Exception:
        return None
    return interpreter


# --- PyTorch ---


def nvrtc_compile() -> Callable[..., Any] | None:
    """torch.cuda._compile_kernel (NVRTC, PyTorch >= 2.8), or None."""
    return getattr(torch.cuda, "_compile_kernel", None)


@functools.lru_cache(maxsize=None)
def cuda_driver() -> Any:
    """The CUDA driver library as PyTorch loads it (ctypes), loaded once (torch's helper loads it anew on every
    call)."""
    from torch.cuda._utils import _get_gpu_runtime_library

    return _get_gpu_runtime_library()


def check_cuda(error: int) -> None:
    """Raise PyTorch's error for a CUDA driver result code (0: success)."""
    from torch.cuda._utils import _check_cuda

    _check_cuda(error)


def stream_capturing_fn() -> Callable[[], bool]:
    """Whether the current CUDA stream is capturing a graph: torch.cuda.is_current_stream_capturing without its
    Python wrapper, where this torch has the C function."""
    return getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing


def current_raw_stream(device_index: int) -> int:
    """The current CUDA stream's handle on a GPU (the call Triton's launcher makes, where this torch has it)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device_index) if raw is not None else torch.cuda.current_stream(device_index).cuda_stream


def scaled_mm() -> Callable[..., torch.Tensor] | None:
    """torch._scaled_mm (FP8 matmul with scales), or None."""
    return getattr(torch, "_scaled_mm", None)


def gpu_sleep() -> Callable[[int], None] | None:
    """torch.cuda._sleep(cycles): a GPU kernel that spins for about that many clock cycles; None where absent."""
    return getattr(torch.cuda, "_sleep", None)


def record_memory_history(enabled: bool, max_entries: int = 100_000) -> bool:
    """Start (or stop) recording every CUDA allocation with its Python stack
    (torch.cuda.memory._record_memory_history); False where this torch lacks it."""
    record = getattr(torch.cuda.memory, "_record_memory_history", None)
    if record is None:
        return False
    if enabled:
        record("all", context="all", stacks="python", max_entries=max_entries)
    else:
        record(None)
    return True


def memory_snapshot() -> dict | None:
    """The caching allocator's state and recorded trace (torch.cuda.memory._snapshot), or None where absent."""
    snap = getattr(torch.cuda.memory, "_snapshot", None)
    return snap() if snap is not None else None


def reset_compiled() -> None:
    """Forget every torch.compile'd graph (torch._dynamo.reset), so a new case does not hit the recompile limit."""
    reset = getattr(getattr(torch, "_dynamo", None), "reset", None)
    if reset is not None:
        reset()


def allow_retained_backward_in_compile() -> None:
    """Let compiled functions' backward run with retain_graph=True (torch._functorch's donated buffers forbid it)."""
    try:
        import torch._functorch.config as functorch_config
        functorch_config.donated_buffer = False
    except (ImportError, AttributeError):
        pass


def ddp_bucket_sizes(ddp: Any) -> list[int]:
    """The sizes (bytes) of a DistributedDataParallel model's gradient buckets, in the order it fills them, from
    its logging data (after its first backward DDP regroups them in the order gradients become ready); [] where
    that data is missing."""
    getter = getattr(ddp, "_get_ddp_logging_data", None)
    data = getter() if callable(getter) else {}
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
    return [int(v) for v in str(sizes).split(",") if v.strip()]


def dispatch_mode() -> type:
    """torch.utils._python_dispatch.TorchDispatchMode: a context that sees every aten op a call runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def install_compile_module_tags() -> None:
    """Apply torch.compile's one-time patch of nn.Module.__init__ and __setstate__ now (it tags modules made
    inside compiled code); a no-op where this PyTorch has no such hook."""
    try:
        from torch._dynamo.mutation_guard import install_generation_tagging_init
    except ImportError:
        return
    install_generation_tagging_init()


def torch_mode_depths() -> tuple[int, int]:
    """How many torch function and dispatch modes are on now; (0, 0) where this PyTorch cannot say."""
    try:
        return torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()
    except AttributeError:
        return 0, 0


def profiler_enabled() -> bool:
    """Whether an autograd profiler is recording in this process; False where this PyTorch cannot say."""
    probe = getattr(torch.autograd, "_profiler_enabled", None)
    return bool(probe()) if probe is not None else False
