"""The GPU's clocks and power as `nvidia-smi` reports them: a snapshot, a report, samples during a run.

A GPU does not run at one speed: it idles at a low clock, boosts when busy, and lowers its clock
when it reaches its power or temperature limit. Every function returns None where there is no
`nvidia-smi` (a CPU-only machine), so notebooks print one line instead of failing.
"""
from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime

import torch

FIELDS = ("timestamp", "clocks.sm", "clocks.max.sm", "clocks.mem", "power.draw", "power.limit", "temperature.gpu")


def nvidia_smi() -> str | None:
    """The path of nvidia-smi, or None where it is not installed."""
    return shutil.which("nvidia-smi")


def gpu_id(device: torch.device | int | None = None) -> str:
    """How nvidia-smi names the GPU torch calls `device`: 'GPU-<uuid>' when nvidia-smi knows that UUID
    (indices differ under CUDA_VISIBLE_DEVICES), else torch's index."""
    index = device if isinstance(device, int) else (device.index if device is not None and device.index is not None
                                                     else torch.cuda.current_device())
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid and query(f"GPU-{uuid}", ("index",)) is not None:
        return f"GPU-{uuid}"
    return str(index)


def _run(args: list[str], timeout: float = 20.0) -> str | None:
    smi = nvidia_smi()
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, *args], capture_output=True, text=True, timeout=timeout, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def _number(text: str) -> float:
    try:
        return float(text.strip().split()[0])
    except (ValueError, IndexError):
        return math.nan  # "[N/A]", "[Not Supported]"


def report(gpu: str = "0", section: str = "CLOCK") -> str | None:
    """`nvidia-smi -q -d SECTION -i GPU` as text (sections: CLOCK, POWER, PERFORMANCE, TEMPERATURE)."""
    return _run(["-q", "-d", section, "-i", gpu])


def query(gpu: str = "0", fields: tuple[str, ...] = FIELDS[1:]) -> dict[str, float] | None:
    """One reading of numeric fields (MHz, W, degrees C), e.g. {'clocks.sm': 1980.0, ...}."""
    out = _run([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", gpu])
    if not out or not out.strip():
        return None
    values = out.strip().splitlines()[0].split(",")
    return {f: _number(v) for f, v in zip(fields, values)} if len(values) == len(fields) else None


@dataclass(frozen=True)
class Sample:
    """One reading during a run: seconds since the epoch, SM clock (MHz), power (W), temperature (C)."""

    t: float
    sm_mhz: float
    power_w: float
    temp_c: float


def now() -> float:
    """Seconds since the epoch, on the same clock as the samples' timestamps."""
    return datetime.now().timestamp()


def parse_sample(line: str) -> Sample | None:
    """'2026/11/22 16:05:12.345, 1980, 650.1, 54' -> Sample; None for a line that is not one."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    try:
        t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:
        return None
    return Sample(t, _number(parts[1]), _number(parts[2]), _number(parts[3]))


class Sampler:
    """Read the SM clock, power and temperature every `every_ms` while the `with` block runs.

        with labkit.clocks.Sampler(gpu) as s:
            ...work...
        s.samples  # list of Sample (empty where nvidia-smi is missing)
    """

    def __init__(self, gpu: str = "0", every_ms: int = 50) -> None:
        self.gpu, self.every_ms = gpu, every_ms
        self.samples: list[Sample] = []
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "Sampler":
        smi = nvidia_smi()
        if smi is not None:
            try:
                self._proc = subprocess.Popen(
                    [smi, "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                     "--format=csv,noheader,nounits", "-lms", str(self.every_ms), "-i", self.gpu],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                self._proc = None
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            out, _ = self._proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
        self.samples = [s for s in map(parse_sample, (out or "").splitlines()) if s is not None]

    def at(self, t: float) -> Sample | None:
        """The sample nearest in time to `t` (seconds since the epoch), or None without samples."""
        return min(self.samples, key=lambda s: abs(s.t - t)) if self.samples else None


def fp32_lanes_per_sm(major: int, minor: int) -> int | None:
    """FP32 results per clock per SM (add, multiply or FMA), from the CUDA C++ Programming Guide's
    arithmetic-instruction throughput table; None for an architecture not listed there."""
    table = {(6, 0): 64, (6, 1): 128, (7, 0): 64, (7, 2): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128,
             (8, 7): 128, (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}
    return table.get((major, minor))
