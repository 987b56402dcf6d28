"""What judges a timed exercise, held as it was before student code ran. Used by: labkit.grading.child and the
timed exercises (ex03_timing, ex11_profiling, ex13_capstone); `check_observers()` holds the launch observer of the
untimed Triton exercises the same way.

`capture()` (in the grading child, before the notebook's cells run) records the grader's helpers (every function
and class of the judging modules and the launch observer, and the functions of their classes), the torch functions
the baseline calls, and the process state a baseline is timed under. `changed()` names what a notebook rebound
since; `clean()` runs the baseline under the captured state (hooks, modes, anomaly mode, profilers, tracers cleared;
the notebook's state restored after) and refuses to time it while a thread the notebook started is alive.
"""
from __future__ import annotations

import gc
import importlib
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.modules.module as nn_module

from labkit import compat

JUDGING = ("labkit.exercises.ex03_timing", "labkit.exercises.ex11_profiling", "labkit.exercises.ex13_capstone",
           "labkit.exercises.speed", "labkit.exercises.integrity", "labkit.exercises.observe", "labkit.timing",
           "labkit.capstone.model", "labkit.capstone.train", "labkit.capstone.data", "torch.nn.functional")
# What judges an untimed function from inside its call: the Triton launch observer (exercises 05, 09), whose
# `touched`/`produced` a notebook could otherwise rebind to say its kernel ran
OBSERVERS = ("labkit.exercises.launches",)
CLASSES = (torch.Tensor, torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader)
HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
         "_global_backward_pre_hooks", "_global_module_registration_hooks", "_global_parameter_registration_hooks",
         "_global_buffer_registration_hooks")


class Tampered(RuntimeError):
    """The notebook changed what judges it: its timed result is not graded."""


_pinned: dict[str, tuple[object, dict[str, object]]] = {}  # namespace -> (its object, what it held)
_clean: dict = {}
_threads: set[int] = set()


def _held(ns: object) -> dict[str, object]:
    # the observer's strings too: its LABKIT_DIR decides which kernels are the notebook's own
    kinds = (staticmethod, classmethod, property) + ((str,) if getattr(ns, "__name__", None) in OBSERVERS else ())
    return {k: v for k, v in list(vars(ns).items()) if callable(v) or isinstance(v, kinds)}


def _namespaces(modules: tuple[str, ...] = JUDGING + OBSERVERS,
                classes: tuple[type, ...] = CLASSES) -> Iterator[tuple[str, object]]:
    """The judging modules, their own classes, and torch's classes the baseline runs on (every base of each)."""
    classes = list(classes)
    for name in modules:
        mod = importlib.import_module(name)
        yield name, mod
        classes += [v for v in vars(mod).values() if isinstance(v, type) and v.__module__ == name]
    for cls in classes:
        for base in cls.__mro__[:-1]:
            yield f"{base.__module__}.{base.__qualname__}", base


def threads() -> int | None:
    """torch's CPU threads before student code (None outside the grading child): both sides of a pair run so."""
    return _clean.get("threads")


def _state() -> dict:
    return {"anomaly": torch.is_anomaly_enabled(), "grad": torch.is_grad_enabled(),
            "matmul": torch.get_float32_matmul_precision(), "profile": sys.getprofile(), "trace": sys.gettrace(),
            "thread_profile": threading.getprofile(), "thread_trace": threading.gettrace(),
            "gc_callbacks": list(gc.callbacks), "gc": gc.isenabled(),
            "hooks": {h: dict(getattr(nn_module, h)) for h in HOOKS if hasattr(nn_module, h)}}


def _apply(s: dict) -> None:
    torch.autograd.set_detect_anomaly(s["anomaly"])
    torch.set_grad_enabled(s["grad"])
    torch.set_float32_matmul_precision(s["matmul"])
    sys.setprofile(s["profile"])
    sys.settrace(s["trace"])
    threading.setprofile(s["thread_profile"])
    threading.settrace(s["thread_trace"])
    gc.callbacks[:] = s["gc_callbacks"]
    (gc.enable if s["gc"] else gc.disable)()
    for h, entries in s["hooks"].items():
        d = getattr(nn_module, h)
        d.clear()
        d.update(entries)


def _modes() -> tuple[int, int]:
    return compat.torch_mode_depths()


def capture() -> None:
    """Record the judging code and the process state, before any student code runs."""
    compat.install_compile_module_tags()  # torch.compile's own patch of nn.Module, applied before it is pinned
    try:
        import tqdm

        tqdm.tqdm.monitor_interval = 0  # no tqdm monitor thread: a progress bar is not a thread left running
    except ImportError:
        pass
    _pinned.clear()
    for where, ns in _namespaces():
        _pinned[where] = (ns, _held(ns))
    _clean.clear()
    _clean.update(_state(), modes=_modes(), threads=torch.get_num_threads())
    _threads.clear()
    _threads.update(t.ident for t in threading.enumerate())


def capture_observers() -> None:
    """Record only the launch observer (OBSERVERS), before any student code runs: where nothing is timed, the rest
    of capture() (importing every judging module) is time no check needs."""
    for where, ns in _namespaces(OBSERVERS, ()):
        _pinned.setdefault(where, (ns, _held(ns)))


def changed(within: tuple[str, ...] | None = None) -> list[str]:
    """The judging functions, classes and methods the notebook rebound, removed or (on a class) shadowed since
    `capture()` (`within`: only in these modules and their classes)."""
    out = []
    for where, (ns, held) in _pinned.items():
        if within is not None and not any(where == m or where.startswith(m + ".") for m in within):
            continue
        now = _held(ns)
        out += [f"{where}.{k}" for k, v in held.items() if now.get(k, _MISSING) is not v]
        if isinstance(ns, type):
            out += [f"{where}.{k}" for k in now.keys() - held.keys()]
    return out


_MISSING = object()


def stray_threads() -> list[str]:
    """Threads alive now that were not before student code ran."""
    return [t.name for t in threading.enumerate() if t.ident not in _threads and t.is_alive()]


def check(when: str) -> None:
    """Tampered when the judging code was rebound, or a thread or a torch mode the notebook started is still on."""
    if not _clean:
        return  # not in the grading child (a notebook's own preview): nothing captured
    problems = []
    if (names := changed()):
        problems.append(f"the notebook rebound the grader's {', '.join(names[:4])}"
                        + (f" and {len(names) - 4} more" if len(names) > 4 else ""))
    if (names := stray_threads()):
        problems.append(f"threads it started were running ({', '.join(names[:3])}): they would share the "
                        "process with what the grader times; join them before returning")
    if _modes() != _clean["modes"]:
        problems.append("a torch function or dispatch mode it entered was still on")
    if compat.profiler_enabled():
        problems.append("a profiler it started was still on")
    if problems:
        raise Tampered(f"{when}: {'; '.join(problems)}. Nothing a notebook does may change how the grader times it")


def check_observers(when: str) -> None:
    """Tampered when the notebook rebound what observes an untimed call (OBSERVERS); nothing else of its process
    state is held against an untimed function."""
    if _pinned and (names := changed(OBSERVERS)):
        raise Tampered(f"{when}: the notebook rebound the grader's {', '.join(names[:4])}"
                       + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                       + ". Nothing a notebook does may change how the grader observes its call")


@contextmanager
def clean(when: str = "before the baseline was timed") -> Iterator[None]:
    """Run the grader's baseline under the process state captured before student code (the notebook's restored
    after), with its leftovers collected first; Tampered when something the notebook left would reach it."""
    check(when)
    if not _clean:
        yield
        return
    gc.collect()  # the notebook's objects finalized now, not while the baseline is timed
    saved = _state()
    _apply(_clean)
    try:
        yield
    finally:
        _apply(saved)
