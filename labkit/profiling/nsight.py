"""Running NVIDIA's profilers from Python: the `ncu` command line, its report exported as CSV and
parsed, and `nsys` with its kernel summary; each says in one line why it made no report.

Used by: notebook 11 (through labkit.profiling).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from labkit.profiling.ncu_report import NCU_METRICS, KernelLaunch, parse_ncu_csv
from labkit.paths import child_env


def ncu_command(target: Sequence[str], report: str | Path, nvtx_ranges: Sequence[str] = (),
                kernel_regex: str | None = None, launch_skip: int = 0, launch_count: int | None = None,
                metrics: Sequence[str] = NCU_METRICS, section_set: str | None = None) -> list[str]:
    """The ncu command line: profile `target`'s kernels inside the NVTX push/pop ranges or matching
    the regex, clocks left alone (--clock-control none), metrics into `report`.ncu-rep."""
    cmd = ["ncu", "--clock-control", "none", "--target-processes", "all", "--force-overwrite",
           "--export", str(report)]
    if nvtx_ranges:
        cmd.append("--nvtx")
        for r in nvtx_ranges:
            cmd += ["--nvtx-include", f"{r}/"]
    if kernel_regex:
        cmd += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_skip:
        cmd += ["--launch-skip", str(launch_skip)]
    if launch_count:
        cmd += ["--launch-count", str(launch_count)]
    if section_set:
        cmd += ["--set", section_set]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    return cmd + list(target)


def ncu_problem(output: str) -> str | None:
    """One line saying why ncu made no report (counters not permitted, nothing matched), or None."""
    if "ERR_NVGPUCTRPERM" in output:
        return ("ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): an admin must allow "
                "them for all users (nvidia kernel module option NVreg_RestrictProfilingToAdminUsers=0), "
                "or run ncu as root")
    if "No kernels were profiled" in output:
        return "ncu ran but profiled no kernel: the NVTX range or kernel-name filter matched nothing"
    errors = [line for line in output.splitlines() if line.startswith("==ERROR==")]
    return errors[0] if errors else None


def run_ncu(cmd: Sequence[str], timeout: float = 240) -> tuple[list[KernelLaunch], str]:
    """Run an ncu command built by `ncu_command`, import its report as raw CSV and parse it.

    Returns (launches, message); launches is empty and message says why when ncu is missing,
    counters are not permitted, or nothing was profiled."""
    exe = shutil.which(cmd[0])
    if exe is None:
        return [], "ncu is not installed here (it comes with the CUDA toolkit or as Nsight Compute)"
    try:
        run = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired:
        return [], f"ncu did not finish within {timeout:.0f} s: select fewer kernels (--launch-count) or metrics"
    said = run.stdout + run.stderr
    report = cmd[cmd.index("--export") + 1]
    rep = Path(report if report.endswith(".ncu-rep") else report + ".ncu-rep")
    if not rep.is_file():
        return [], ncu_problem(said) or f"ncu exited with {run.returncode} and wrote no report: {said.strip()[-300:]}"
    csv_text = export_csv(rep, exe)
    try:
        launches = parse_ncu_csv(csv_text)
    except ValueError as e:
        return [], f"{ncu_problem(said) or e}"
    if not launches:
        return [], ncu_problem(said) or "ncu's report holds no kernel"
    return launches, f"ncu profiled {len(launches)} kernel launch(es) into {rep}"


def export_csv(report: Path, exe: str = "ncu") -> str:
    """A saved .ncu-rep as raw-page CSV in base units (`ncu --import R --csv --page raw`; needs no GPU)."""
    out = subprocess.run([exe, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"],
                         capture_output=True, text=True, timeout=120)
    return out.stdout



def run_nsys(target: Sequence[str], report: str | Path, timeout: float = 120) -> tuple[str | None, str]:
    """`nsys profile --trace cuda,nvtx,osrt` then `nsys stats` (kernel summary as CSV).
    Returns (csv text or None, message): nsys may be missing or unable to write its report."""
    exe = shutil.which("nsys")
    if exe is None:
        return None, "nsys is not installed here (it comes with the CUDA toolkit or as Nsight Systems)"
    cmd = [exe, "profile", "--trace", "cuda,nvtx,osrt", "--sample", "none", "--force-overwrite", "true",
           "--output", str(report), *target]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired:
        return None, f"nsys did not finish within {timeout:.0f} s on this machine"
    rep = Path(str(report) + ".nsys-rep")
    if run.returncode != 0 or not rep.is_file():
        last = (run.stderr or run.stdout).strip().splitlines()[-1:] or [f"exit status {run.returncode}"]
        return None, f"nsys could not make a report on this machine: {last[0][:300]}"
    try:
        stats = subprocess.run([exe, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv", "--force-export",
                                "true", str(rep)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"nsys stats did not finish within {timeout:.0f} s"
    if stats.returncode != 0:
        return None, f"nsys stats failed: {(stats.stderr or stats.stdout).strip()[-300:]}"
    return stats.stdout, f"nsys wrote {rep}"
