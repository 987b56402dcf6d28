"""Start a labkit script on N processes with torchrun, and the set-up every such script shares.

From a notebook or a test:  `result = launch.torchrun("labkit.parallel.pipeline", 2, ["--m", "4"])`.
Inside the script:          `ctx = launch.start(args)` ... `launch.finish(ctx, result, args.out)`.
`--standalone` lets torchrun's rendezvous pick a free port, so no port is fixed.
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

from labkit.ddp_train import _sync as sync  # noqa: F401  (launch.sync: wait for this rank's device)
from labkit import proctree
from labkit.ddp_train import choose, init_group
from labkit.paths import child_env

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


def add_common(ap: argparse.ArgumentParser) -> None:
    """The options every parallel script takes."""
    ap.add_argument("--out", type=Path, required=True, help="JSON file rank 0 writes the results to")
    ap.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                    help="auto: nccl on GPUs, gloo on CPUs")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: one GPU per process when there are enough, else the CPU")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per process")
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
    device = init_group(backend, dev_type, local_rank, args.threads)
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


