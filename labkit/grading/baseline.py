"""labkit's baseline for a function graded in rounds, in a clean process: `python -m labkit.grading.baseline JOB`.

JOB (JSON): the function, the device, the cores to run on, the fd its replies go to. It serves the parent's
requests on stdin (labkit.grading.rounds) with the exercise's own baseline and no student code: the process state
a baseline is timed under is the one labkit starts with, whatever the student's process did to its own.
"""
from __future__ import annotations

import ctypes
import functools
import json
import os
import sys
import time

CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06  # cuda.h's CUlimit


@functools.lru_cache(maxsize=None)
def cuda_driver() -> ctypes.CDLL | None:
    """The CUDA driver library as PyTorch loads it (labkit.compat.cuda_driver), or None where this machine has none
    (or its GPU runtime is not CUDA's)."""
    from labkit import compat  # (imports torch: only once the job's cores are set)

    try:
        lib = compat.cuda_driver()
    except OSError:
        return None
    return lib if hasattr(lib, "cuCtxSetLimit") else None


def reset_persisting_l2() -> str | None:
    """Give the whole L2 back to normal accesses: no set-aside for persisting lines, and every persisting line made
    normal (cuCtxSetLimit, cuCtxResetPersistingL2Cache, on this thread's current CUDA context), so that no carve-out
    shrinks the cache the baseline runs with (one the student's process set was not seen to reach this process on
    two H200s: README, "What it does not"). None, or why it could not."""
    cu = cuda_driver()
    if cu is None:
        return "no CUDA driver library (libcuda)"
    limit = cu.cuCtxSetLimit(ctypes.c_int(CU_LIMIT_PERSISTING_L2_CACHE_SIZE), ctypes.c_size_t(0))
    lines = cu.cuCtxResetPersistingL2Cache()
    if limit == lines == 0:
        return None
    return f"the driver refused (CUresult {limit} setting the limit, {lines} resetting)"


def persisting_l2_limit() -> int | None:
    """The persisting-L2 set-aside (bytes) this thread's CUDA context reports, or None where it cannot tell."""
    cu, size = cuda_driver(), ctypes.c_size_t(0)
    if cu is None or cu.cuCtxGetLimit(ctypes.byref(size), ctypes.c_int(CU_LIMIT_PERSISTING_L2_CACHE_SIZE)) != 0:
        return None
    return size.value


def _gpu_op_s(torch) -> float:
    """Seconds a one-element op takes to finish, after the L2 is given back to normal accesses (not timed)."""
    x = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    reset_persisting_l2()
    t0 = time.perf_counter()
    x.add_(1)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(job_text: str) -> None:
    job = json.loads(job_text)
    if job.get("cpus"):
        os.sched_setaffinity(0, job["cpus"])
    import torch

    import labkit
    from labkit import exercises
    from labkit.grading import protocol, seal

    labkit.setup(device=job["device"], quick=True)
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    spec = exercises.function(job["function"]).rounds
    try:
        import triton  # noqa: F401  (as the grading child does, before its guard)
        import triton.language  # noqa: F401
    except ImportError:
        pass
    if job.get("guard"):  # the grading child's audit hook, so that both sides of a pair carry its cost
        from labkit.grading.guard import install_guard

        install_guard(*job["guard"])
    stdin, reply_fd = sys.stdin.fileno(), int(job["reply_fd"])

    def run_round(req: dict) -> dict:
        if req["kind"] == "idle":  # seconds a one-element op takes to finish here: long while another process's
            return {"obs": _gpu_op_s(torch) if job["device"] == "cuda" else 0.0}  # kernels hold the GPU (each
        # baseline round is preceded by this request, so the L2 reset in _gpu_op_s comes before every round)
        if req["kind"] != "round":
            return {"checked": True}
        try:
            return {"obs": spec.run(spec.baseline, req["args"])}
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    try:
        protocol.serve(lambda: json.loads(seal.read_frame(stdin)), run_round,
                       lambda reply: protocol.write_all(reply_fd, protocol.encode_reply(reply)))
    except EOFError:  # the parent went away
        pass


if __name__ == "__main__":
    main(sys.argv[1])
