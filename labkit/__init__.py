"""labkit: the timing helpers, machine facts and kernels behind the course's notebooks.

Importing labkit never imports triton: call `labkit.setup()` first, so that on a machine
without a GPU the Triton interpreter is on before any kernel is defined.
"""
from labkit import ceilings, reference
from labkit.claims import claim, diagnosis, guess, skip as skip_claim
from labkit.device import current, gpu_count, have_gpus, machine_info, setup, show_machine, sized
from labkit.figures import record
from labkit.stats import Samples
from labkit.timing import Timing, bench, bench_each, bench_interleaved, gbps, tflops

__all__ = ["ceilings", "reference", "claim", "diagnosis", "guess", "skip_claim", "current", "gpu_count", "have_gpus",
           "machine_info", "setup", "show_machine", "sized", "record", "Samples", "Timing", "bench", "bench_each",
           "bench_interleaved", "gbps", "tflops"]
