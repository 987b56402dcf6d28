"""labkit's baseline for a function graded in rounds, in a clean process: `python -m labkit.grading.baseline JOB`.

JOB (JSON): the function, the device, the cores to run on, the fd its replies go to. It serves the parent's
requests on stdin (labkit.grading.rounds) with the exercise's own baseline and no student code: the process state
a baseline is timed under is the one labkit starts with, whatever the student's process did to its own.
"""
from __future__ import annotations

import json
import os
import sys
import time


def _gpu_op_s(torch) -> float:
    x = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
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
    from labkit.grading import rounds, seal

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
            return {"obs": _gpu_op_s(torch) if job["device"] == "cuda" else 0.0}  # kernels hold the GPU
        if req["kind"] != "round":
            return {"checked": True}
        try:
            return {"obs": spec.run(spec.baseline, req["args"])}
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    try:
        rounds.serve(lambda: json.loads(seal.read_frame(stdin)), run_round,
                     lambda reply: rounds.write_all(reply_fd, rounds.encode_reply(reply)))
    except EOFError:  # the parent went away
        pass


if __name__ == "__main__":
    main(sys.argv[1])
