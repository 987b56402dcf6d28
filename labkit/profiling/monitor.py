"""Watch a GPU while it works: NVML (the library behind nvidia-smi) sampled in a background thread.

    with labkit.profiling.monitor.Sampler(interval_s=0.05) as s:
        workload()
    s.samples  # [{"t": 0.0, "util_gpu": 100, "sm_mhz": 1980, "power_w": 310.0, ...}, ...]

Needs `nvidia-ml-py` (`import pynvml`) and an NVIDIA GPU; without either it prints one line saying
so and records nothing. Utilisation is NVML's: the share of the last sample period in which *any*
kernel ran, so one tiny kernel at a time reads 100%.

Used by: notebook 11.
"""
from __future__ import annotations

import threading
import time
from typing import Any

# NVML's clock-event ("throttle") reason bits (nvml.h, nvmlClocksEventReason*)
THROTTLE_REASONS = {
    0x1: "idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}
FIELDS = ("t", "util_gpu", "util_mem", "mem_used_gib", "sm_mhz", "power_w", "temp_c", "throttle")


def throttle_names(mask: int) -> list[str]:
    """NVML's reason bitmask as words (empty: running at the clocks it wants)."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def _load_nvml(nvml: Any = None) -> tuple[Any, str]:
    """(the NVML module, '') or (None, why not)."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None, ("NVML monitoring needs nvidia-ml-py (pip install nvidia-ml-py, or the course's "
                          "'gpu' extra) and an NVIDIA driver; nothing is sampled here")
    try:
        nvml.nvmlInit()
        if nvml.nvmlDeviceGetCount() < 1:
            return None, "NVML sees no NVIDIA GPU on this machine; nothing is sampled here"
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded...
        return None, f"NVML could not start ({type(e).__name__}: {e}): no NVIDIA driver here; nothing is sampled"
    return nvml, ""


class Sampler:
    """Samples one GPU's utilisation, memory, SM clock, power, temperature and throttle reasons every
    `interval_s` seconds in a background thread, between start() and stop() (or inside `with`)."""

    def __init__(self, index: int = 0, interval_s: float = 0.05, nvml: Any = None, quiet: bool = False):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s}")
        self.index, self.interval_s, self._nvml_arg, self.quiet = index, interval_s, nvml, quiet
        self.samples: list[dict[str, Any]] = []
        self.marks: list[tuple[float, str]] = []
        self.message = ""
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._t0 = 0.0

    @property
    def ok(self) -> bool:
        """True when NVML is sampling (or sampled) a GPU."""
        return not self.message

    def start(self) -> "Sampler":
        if self._thread is not None:
            raise RuntimeError("this Sampler is already running: stop() it first, or make a new one")
        nvml, self.message = _load_nvml(self._nvml_arg)
        if nvml is None:
            if not self.quiet:
                print(self.message)
            return self
        self._nvml = nvml
        self._handle = nvml.nvmlDeviceGetHandleByIndex(self.index)
        self.samples, self.marks = [], []
        self._stop.clear()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="labkit-nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def now(self) -> float:
        """Seconds since sampling started (the clock of the samples' "t")."""
        return time.perf_counter() - self._t0

    def mark(self, label: str) -> None:
        """Note a moment (e.g. a phase of the workload starting) on the sampler's clock."""
        self.marks.append((time.perf_counter() - self._t0, label))

    def _read(self) -> dict[str, Any]:
        n, h = self._nvml, self._handle
        util = n.nvmlDeviceGetUtilizationRates(h)
        reasons = (getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or n.nvmlDeviceGetCurrentClocksThrottleReasons)
        return {"t": time.perf_counter() - self._t0, "util_gpu": util.gpu, "util_mem": util.memory,
                "mem_used_gib": n.nvmlDeviceGetMemoryInfo(h).used / 2**30,
                "sm_mhz": n.nvmlDeviceGetClockInfo(h, getattr(n, "NVML_CLOCK_SM", 1)),
                "power_w": n.nvmlDeviceGetPowerUsage(h) / 1e3,
                "temp_c": n.nvmlDeviceGetTemperature(h, getattr(n, "NVML_TEMPERATURE_GPU", 0)),
                "throttle": throttle_names(int(reasons(h)))}

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self._read())
            except Exception as e:  # a query this GPU does not support: say so once, stop sampling
                self.message = f"NVML query failed ({type(e).__name__}: {e}); sampling stopped"
                return
            self._stop.wait(self.interval_s)

    def stop(self) -> "Sampler":
        """Stop sampling and wait for the thread (safe to call twice, or after start() degraded)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=max(1.0, 5 * self.interval_s))
            self._thread = None
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def series(self, name: str) -> list[Any]:
        """One field over time, e.g. series('util_gpu')."""
        if name not in FIELDS:
            raise KeyError(f"no field {name!r}; fields: {FIELDS}")
        return [s[name] for s in self.samples]

    def between(self, t0: float, t1: float, name: str) -> list[Any]:
        """One field's samples taken between t0 and t1 seconds (the sampler's clock)."""
        return [s[name] for s in self.samples if t0 <= s["t"] <= t1]
