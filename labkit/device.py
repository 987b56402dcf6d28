"""Which device the course runs on, what that machine is, and quick mode.

Call `setup()` before anything imports `triton`: on a machine without a GPU it turns on the
Triton interpreter so every Triton kernel in the course runs on the CPU.
"""
from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass

import torch

ENV_DEVICE = "LABKIT_DEVICE"  # "cuda", "cuda:1", "cpu"
ENV_QUICK = "LABKIT_QUICK"  # "1" shrinks problem sizes, "0" forces full size


@dataclass(frozen=True)
class Setup:
    """The choices a notebook runs under."""

    device: torch.device
    quick: bool
    triton_interpreter: bool

    @property
    def is_gpu(self) -> bool:
        return self.device.type == "cuda"


_current: Setup | None = None


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r}: use 1 or 0 (or leave it unset for automatic)")


def choose_device(device: str | torch.device | None = None) -> torch.device:
    """The argument if given, else $LABKIT_DEVICE, else 'cuda' when a GPU is present, else 'cpu'."""
    wanted = device if device not in (None, "", "auto") else os.environ.get(ENV_DEVICE) or None
    if wanted in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(wanted)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"device {str(dev)!r} was asked for, but PyTorch sees no CUDA GPU here "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). "
                f"Leave device unset (or set it to 'cpu') to run on the CPU."
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise RuntimeError(
                f"device {str(dev)!r} was asked for, but this machine has "
                f"{torch.cuda.device_count()} GPU(s): use cuda:0 .. cuda:{torch.cuda.device_count() - 1}."
            )
    elif dev.type != "cpu":
        raise ValueError(f"device {str(dev)!r} is not supported by the course: use 'cuda' or 'cpu'.")
    return dev


def setup(device: str | torch.device | None = None, quick: bool | None = None) -> Setup:
    """Pick the device and quick mode (arguments win over $LABKIT_DEVICE / $LABKIT_QUICK)."""
    global _current
    dev = choose_device(device)
    if quick is None:
        quick = _env_flag(ENV_QUICK)
    if quick is None:
        quick = dev.type != "cuda"
    interpreter = dev.type != "cuda"
    if interpreter:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            warnings.warn(
                "triton was imported before labkit.setup(): its kernels will not run on the CPU. "
                "Restart the kernel and call labkit.setup() before importing triton.",
                stacklevel=2,
            )
        os.environ["TRITON_INTERPRET"] = "1"
        _fix_old_triton_interpreter()
    if dev.type == "cuda" and dev.index is not None:  # set_device needs an index; plain "cuda" keeps the current GPU
        torch.cuda.set_device(dev)
    _current = Setup(device=dev, quick=bool(quick), triton_interpreter=interpreter)
    return _current


def _fix_old_triton_interpreter() -> None:
    """Triton < 3.7's interpreter passes scalar arguments as 1-element arrays, which NumPy 2 refuses
    as an index, so `range(0, n, BLOCK)` in a kernel fails; convert them as Triton 3.7+ does."""
    try:
        from importlib.metadata import version
        if tuple(int(p) for p in version("triton").split(".")[:2]) >= (3, 7):
            return
        from triton.runtime import interpreter
    except Exception:  # no triton, or one laid out differently: nothing to mend
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "labkit_fixed", False):
        return

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched.labkit_fixed = True
    patched.labkit_original = original  # so a test can put Triton back as it was
    interpreter._patch_lang_tensor = patched


def current() -> Setup:
    """The setup in force (made with defaults on first use)."""
    return _current if _current is not None else setup()


def sized(full, quick):
    """`quick` in quick mode, else `full`: problem sizes that fit the machine."""
    return quick if current().quick else full


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def have_gpus(n: int = 1, section: str = "this section") -> bool:
    """True when n GPUs are usable; otherwise prints one line saying what is skipped."""
    if current().is_gpu and gpu_count() >= n:
        return True
    have = gpu_count() if current().is_gpu else 0
    need = "a CUDA GPU" if n == 1 else f"{n} CUDA GPUs"
    print(f"[skipped on this machine] {section} needs {need}; running on {current().device} with {have}.")
    return False


@functools.lru_cache(maxsize=None)
def _nvidia_smi(query: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _triton_version() -> str:
    try:
        from importlib.metadata import version
        return version("triton")
    except Exception:
        return "not installed"


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, str]:
    """What this machine is: the facts a measurement depends on."""
    info = {
        "device": str(current().device),
        "quick mode": str(current().quick),
        "Triton interpreter": str(current().triton_interpreter),
        "CPU": _cpu_name(),
        "CPU cores": str(os.cpu_count()),
        "Python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "CUDA (torch build)": str(torch.version.cuda),
    }
    if torch.cuda.is_available():
        index = (current().device.index or 0) if current().is_gpu else 0
        p = torch.cuda.get_device_properties(index)
        info.update({
            "GPU": p.name,
            "GPUs": str(torch.cuda.device_count()),
            "compute capability": f"{p.major}.{p.minor}",
            "SMs": str(p.multi_processor_count),
            "GPU memory": f"{p.total_memory / 2**30:.1f} GiB",
            "L2 cache": f"{getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB",
            "driver": _nvidia_smi("driver_version") or "unknown",
        })
    else:
        info["GPU"] = "none"
    return info


def show_machine() -> dict[str, str]:
    """Print `machine_info()` as one table and return it."""
    info = machine_info()
    width = max(map(len, info))
    print("\n".join(f"{k:<{width}}  {v}" for k, v in info.items()))
    return info
