"""Start a labkit script on N processes with torchrun, and the set-up every such script shares.

From a notebook or a test:  `result = launch.torchrun("labkit.parallel.pipeline", 2, ["--m", "4"])`.
Inside the script:          `ctx = launch.start(args)` ... `launch.finish(ctx, result, args.out)`.
`--standalone` lets torchrun's rendezvous pick a free port, so no port is fixed.

Used by: notebooks 08 and 10, exercise 10, the capstone (13, labkit.capstone.ddp).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from labkit import proctree
from labkit.paths import child_env
from labkit.timing import sync

# NVLink SHARP (NVLS) needs multicast memory, which shared/virtualised GPU hosts often do not grant;
# NCCL then fails at start-up. Without it NCCL uses ring/tree, the algorithms the course models.
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "OMP_NUM_THREADS": "1"}


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def run_bounded(cmd: list[str], env: dict, timeout: float) -> tuple[bool, subprocess.CompletedProcess]:
    """(finished, result) of `cmd`. After `timeout` s each rank prints its Python stack (faulthandler on SIGABRT)
    and every process torchrun started is killed (they run in sessions of their own): none keeps a GPU."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "PYTHONFAULTHANDLER": "1"})
    try:
        out, err = proc.communicate(timeout=timeout)
        return True, subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        pass
    ranks = proctree.below(proc.pid)  # Linux; elsewhere none are found and only torchrun is stopped
    if ranks:
        _signal(ranks, signal.SIGABRT)
        time.sleep(3)  # time to print their stacks
    _signal([*proctree.below(proc.pid), *ranks, proc.pid], signal.SIGKILL)
    out, err = proc.communicate()
    return False, subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(module: str, nproc: int, args: list[str], backend: str = "auto", device: str = "auto",
             out: Path | None = None, timeout: float = 600, echo: bool = True) -> dict:
    """Run `python -m torch.distributed.run --standalone --nproc_per_node nproc -m module ...`; return its JSON."""
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, not {nproc}")
    out = Path(out) if out else Path(tempfile.mkdtemp(prefix="labkit-par-")) / f"{module.rsplit('.', 1)[-1]}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", module, "--out", str(out), "--backend", backend, "--device", device, *map(str, args)]
    env = child_env(**CHILD_ENV)
    if echo:
        print("$ python", " ".join(cmd[1:]).replace(str(out), out.name))
    finished, done = run_bounded(cmd, env, timeout)
    if not finished:
        raise RuntimeError(f"{module} on {nproc} processes did not finish in {timeout:g} s (a hung collective?); "
                           f"every rank was stopped, each printing where it was:\n"
                           f"{(done.stdout + done.stderr)[-6000:]}")
    if done.returncode != 0:
        said = [ln for ln in done.stderr.splitlines() if ln.startswith(module + ":")]   # our own messages (start())
        raise RuntimeError(f"{module} on {nproc} processes failed (exit {done.returncode}):\n"
                           + ("\n".join(said) if said else (done.stdout + done.stderr)[-4000:]))
    if echo and done.stdout.strip():
        print(done.stdout.strip()[-1500:])
    return json.loads(out.read_text())


def choose(backend: str, device: str, local_world: int, cuda_gpus: int) -> tuple[str, str]:
    """The (backend, device type) to use, or a ValueError saying what to change."""
    if device == "auto":
        device = "cuda" if cuda_gpus >= local_world and backend != "gloo" else "cpu"
    if device == "cuda" and cuda_gpus < local_world:
        raise ValueError(f"--device cuda needs one GPU per process: {local_world} processes on this node "
                         f"but {cuda_gpus} GPU(s). Use --nproc_per_node {cuda_gpus} or --device cpu.")
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise ValueError("the nccl backend moves GPU tensors only: use --backend gloo for CPU processes "
                         "(or --device cuda on a machine with GPUs).")
    return backend, device


def default_threads(local_world: int, cores: int | None = None) -> int:
    """Compute threads per CPU process: the cores shared out, less one per process for its communication threads
    (gloo's all-reduce runs on threads of its own; with every core computing they wait for one), at least 1."""
    return max(1, (cores or os.cpu_count() or 1) // local_world - 1)


def init_group(backend: str, dev_type: str, local_rank: int, threads: int) -> torch.device:
    """Join the process group on this rank's device: its own GPU, or the CPU with `threads` threads."""
    import torch.distributed as dist

    if dev_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, threads))
        dist.init_process_group(backend)
    return device


def slowest(seconds: float, device: torch.device) -> float:
    """The largest value over all ranks (the step is done when the slowest rank is)."""
    import torch.distributed as dist
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def timed_on_slowest_rank(fn, calls: int, device: torch.device) -> float:
    """Seconds that `calls` calls of fn take on the slowest rank, the ranks lined up first."""
    sync(device)
    slowest(0.0, device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(device)
    return slowest(time.perf_counter() - t0, device)


def exit_rank(code: int) -> None:
    """End a torchrun worker after its work, skipping C++ static destructors: a gloo or profiler thread still
    joinable at interpreter exit aborts the process ("terminate called without an active exception")."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def add_common(ap: argparse.ArgumentParser, threads: int = 1) -> None:
    """The options every parallel script takes (`threads`: the default of --threads; 0 shares the cores out)."""
    ap.add_argument("--out", type=Path, required=True, help="JSON file rank 0 writes the results to")
    ap.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                    help="auto: nccl on GPUs, gloo on CPUs")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: one GPU per process when there are enough, else the CPU")
    ap.add_argument("--threads", type=int, default=threads,
                    help="CPU threads per process (0: cores / processes - 1, leaving each a core for gloo's threads)")
    ap.add_argument("--seed", type=int, default=0)


@dataclass
class Ctx:
    """What a started process knows: its rank, the world size, its device and backend."""
    rank: int
    world: int
    device: torch.device
    backend: str


def start(args: argparse.Namespace, prog: str) -> Ctx:
    """Join the process group torchrun set up; SystemExit(2) with what to do when that cannot work."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        sys.exit(f"{prog}: no RANK/WORLD_SIZE in the environment: run me with torchrun, e.g. "
                 f"python -m torch.distributed.run --standalone --nproc_per_node 2 -m {prog} --out r.json")

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        backend, dev_type = choose(args.backend, args.device, local_world, gpus)
    except ValueError as exc:   # e.g. fewer GPUs than processes
        sys.exit(f"{prog}: {exc}")
    device = init_group(backend, dev_type, local_rank, args.threads or default_threads(local_world))
    return Ctx(rank, world, device, backend)


def finish(ctx: Ctx, result: dict, out: Path) -> None:
    """Rank 0 writes the result (with where it ran); every rank leaves the process group."""
    import torch.distributed as dist

    hosts = [None] * ctx.world
    dist.all_gather_object(hosts, f"{platform.node()}:{ctx.device}")
    if ctx.rank == 0:
        result = {"world_size": ctx.world, "backend": ctx.backend, "device": ctx.device.type, "hosts": hosts,
                  "torch": torch.__version__, **result}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))


def run_main(prog: str, parse, body, argv: list[str] | None = None) -> int:
    """Parse, start, run `body(args, ctx) -> dict`, write it; always leave the process group (clean exit on error)."""
    import torch.distributed as dist

    args = parse(argv)
    ctx = start(args, prog)
    try:
        result = {"args": {k: v for k, v in vars(args).items() if k != "out"}, **body(args, ctx)}
        finish(ctx, result, args.out)
        if ctx.rank == 0:
            print(f"[{prog}] {ctx.world} x {ctx.backend} on {ctx.device.type}: wrote {args.out}")
    finally:
        # DDP and FSDP objects sit in reference cycles: free them while their process group still
        # exists, or a later collection can abort the process ("terminate called without an active exception")
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


