"""Which device the course runs on, what that machine is, and quick mode.

Call `setup()` before anything imports `triton`: on a machine without a GPU it turns on the
Triton interpreter so every Triton kernel in the course runs on the CPU.
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from labkit.figures import display_entry

ENV_DEVICE = "LABKIT_DEVICE"  # "cuda", "cuda:1", "cpu"
ENV_QUICK = "LABKIT_QUICK"  # "1" shrinks problem sizes, "0" forces full size
ENV_CACHE = "LABKIT_CACHE"  # where measured ceilings and built extensions are kept
# What a notebook's outputs say about where it ran, as data beside the printed line (`labkit ran` reads them):
SKIP_MIME = "application/vnd.labkit.skip+json"  # have_gpus(): a section skipped, and the GPUs it needs
MACHINE_MIME = "application/vnd.labkit.machine+json"  # show_machine(): machine_info()


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

FULL_SIZE_ON_CPU = (
    "full problem sizes on the CPU (quick=False without a GPU): the sizes are made for a GPU, and the "
    "Triton interpreter runs them thousands of times slower; a notebook can take many minutes per cell. "
    "Use quick mode (quick=None or True) unless you mean it.")


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: use 1 or 0 (or leave it unset for automatic)")


def parse_flag(name: str, value: object) -> bool | None:
    """A yes/no parameter as a notebook or `-p NAME VALUE` may pass it: True/False/None, 1/0, or their
    spellings as strings ("False" is False). Anything else is an error that names the parameter."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "none", "null", "auto"):
            return None
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise ValueError(f"parameter {name}={value!r} is not a yes/no value: use True or False "
                     f"(or None to let labkit choose).")


def _device_param(device: object) -> str | torch.device | None:
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        name = device.strip().lower()
        if name in ("", "none", "null", "auto"):
            return None
        if re.fullmatch(r"cpu|cuda(:\d+)?", name):
            return name
    raise ValueError(f"parameter device={device!r} is not a device name: use 'cuda', 'cuda:1' or 'cpu' "
                     f"(or None to let labkit choose).")


def choose_device(device: str | torch.device | None = None) -> torch.device:
    """The argument if given, else $LABKIT_DEVICE, else 'cuda' when a GPU is present, else 'cpu'."""
    device = _device_param(device)
    wanted = device if device is not None else os.environ.get(ENV_DEVICE) or None
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
    """Pick the device and quick mode (arguments win over $LABKIT_DEVICE / $LABKIT_QUICK).

    Parameters arrive from papermill as strings too: quick="False" means False; a value that is
    not a yes/no (or a device name) is an error naming the parameter.
    """
    global _current
    quick = parse_flag("quick", quick)
    dev = choose_device(device)
    if quick is None:
        quick = _env_flag(ENV_QUICK)
    if quick is None:
        quick = dev.type != "cuda"
    if not quick and dev.type != "cuda":
        warnings.warn(FULL_SIZE_ON_CPU, stacklevel=2)
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
        _fix_interpreter_bf16_rounding()
    if dev.type == "cuda" and dev.index is not None:  # set_device needs an index; plain "cuda" keeps the current GPU
        torch.cuda.set_device(dev)
    _current = Setup(device=dev, quick=bool(quick), triton_interpreter=interpreter)
    from labkit import claims  # the first claim is judged by the host's load from here on

    claims.start_watching_load()
    return _current


def _fix_old_triton_interpreter() -> None:
    """Triton < 3.7's interpreter passes scalar arguments as 1-element arrays, which NumPy 2 refuses
    as an index, so `range(0, n, BLOCK)` in a kernel fails; convert them as Triton 3.7+ does."""
    try:
        from importlib.metadata import version
        if tuple(int(p) for p in version("triton").split(".")[:2]) >= (3, 7):
            return
    except Exception:  # no triton: nothing to mend
        return
    from labkit import compat

    interpreter = compat.triton_interpreter()
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "labkit_fixed", False):
        return

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched.labkit_fixed = True
    patched.labkit_original = original  # so a test can put Triton back as it was
    interpreter._patch_lang_tensor = patched


def _fix_interpreter_bf16_rounding() -> None:
    """Triton's interpreter casts fp32 to bf16 by dropping bits (round toward zero), so about a quarter
    of bf16 results were one unit in the last place below what a GPU (round to nearest even) gives.
    Cast with PyTorch's round-to-nearest-even instead, so interpreted kernels round as GPU kernels do."""
    from labkit import compat

    interpreter = compat.triton_interpreter()
    try:
        import numpy as np
        import triton.language as tl
    except Exception:  # no triton: nothing to mend
        return
    builder = getattr(interpreter, "InterpreterBuilder", None)
    if builder is None or getattr(builder.cast_impl, "labkit_fixed", False):
        return
    cast_impl, fp_to_fp = builder.cast_impl, builder.create_fp_to_fp

    def to_bf16(data) -> "np.ndarray":
        arr = np.asarray(data, dtype=np.float32)
        arr = arr if arr.flags.c_contiguous else arr.copy()
        return torch.from_numpy(arr).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).reshape(arr.shape)

    def fp32_to_bf16(src, dst_type) -> bool:
        return src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16

    def patched_cast(self, src, dst_type):
        if fp32_to_bf16(src, dst_type):
            return interpreter.TensorHandle(to_bf16(src.data), dst_type.scalar)
        return cast_impl(self, src, dst_type)

    def patched_fp_to_fp(self, src, dst_type, rounding_mode):
        if fp32_to_bf16(src, dst_type) and rounding_mode in (None, interpreter._ir.ROUNDING_MODE.RTNE):
            return interpreter.TensorHandle(to_bf16(src.data), dst_type.scalar)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    patched_cast.labkit_fixed = True
    builder.cast_impl = patched_cast
    builder.create_fp_trunc = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder.create_fp_to_fp = patched_fp_to_fp


def cpu_bf16_units() -> list[str]:
    """The instruction sets this CPU multiplies bf16 with natively (Linux's /proc/cpuinfo flags avx512_bf16,
    amx_bf16); [] where it has none or this is not Linux: there bf16 matmuls run through fp32 arithmetic."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [u for u in ("avx512_bf16", "amx_bf16") if u in flags]


def cache_dir() -> Path:
    """labkit's cache folder for this machine's measurements and builds: $LABKIT_CACHE, else ~/.cache/labkit."""
    return Path(os.environ.get(ENV_CACHE, Path.home() / ".cache" / "labkit"))


def gpu_index(device: torch.device) -> int:
    """The index of CUDA `device`: its own, or the current GPU's where it names none (torch.device("cuda"))."""
    return device.index if device.index is not None else torch.cuda.current_device()


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
    text = f"[skipped on this machine] {section} needs {need}; running on {current().device} with {have}."
    display_entry(text, SKIP_MIME, {"name": section, "section": section, "needs_gpus": n,
                                    "device": str(current().device), "gpus": have})
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


def _size_bytes(text: str) -> int | None:
    """A cache size as sysfs writes it ("32768K", "1M", "512") in bytes, or None."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text, re.IGNORECASE)
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()] if m else None


def last_level_cache_bytes(device: torch.device | str = "cpu",
                           sysfs: Path = Path("/sys/devices/system/cpu")) -> int | None:
    """The largest cache in front of `device`'s memory, in bytes: a GPU's L2; on a CPU the largest level Linux
    lists for CPU 0 (or macOS's sysctl says); None where it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return getattr(torch.cuda.get_device_properties(device.index or 0), "L2_cache_size", None) or None
    sizes = []
    for f in sysfs.glob("cpu0/cache/index*/size"):
        with contextlib.suppress(OSError):
            sizes.append(_size_bytes(f.read_text()))
    if not any(sizes) and sys.platform == "darwin":  # Apple: per-cluster L2 (perflevel0), L2, L3 by name
        for key in ("hw.perflevel0.l2cachesize", "hw.l2cachesize", "hw.l3cachesize"):
            with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
                sizes.append(int(subprocess.run(["sysctl", "-n", key], capture_output=True, text=True,
                                                timeout=5).stdout.strip() or 0))
    return max((s for s in sizes if s), default=None)


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
    """Print `machine_info()` as one table (and attach it as data) and return it."""
    info = machine_info()
    width = max(map(len, info))
    display_entry("\n".join(f"{k:<{width}}  {v}" for k, v in info.items()), MACHINE_MIME, {"name": "machine", **info})
    return info
