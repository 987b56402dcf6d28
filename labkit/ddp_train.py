"""Train a small MLP with DistributedDataParallel and write what happened as JSON (rank 0).

Launch one process per device with torchrun (gloo on CPUs, NCCL on GPUs):

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m labkit.ddp_train --out r.json

It measures, in order: (1) correctness: a few DDP steps on a global batch split over the ranks,
against one process training on the whole global batch (rank 0), plus the gradient of that
batch by accumulation over micro-batches; (2) that every rank holds identical parameters;
(3) throughput (samples/s) on a fixed per-rank batch, against a plain model on rank 0 alone, and the
parts of a DDP step timed one by one on every rank at once, between DDP steps: the step without its
communication (under `no_sync`), backward alone, DDP's communication alone (its buckets copied in,
all-reduced, copied out) and communication and compute started together;
(4) all-reduce bus bandwidth over message sizes (with more than one process); (5) optionally, the
step time for several DDP bucket sizes and a profiler trace of a few steps (rank 0) showing when
each bucket's all-reduce ran against backward's compute. Timings are per step, a list of samples:
a device synchronize and the slowest rank's clock (`labkit.bench` would pick a different
repetition count on each rank and deadlock the collectives).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit import compat
from labkit.stats import quantile

USAGE = ("run me with torchrun, e.g. python -m torch.distributed.run --standalone --nproc_per_node 2 "
         "-m labkit.ddp_train --out result.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="labkit.ddp_train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file rank 0 writes the results to")
    ap.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                    help="auto: nccl on GPUs, gloo on CPUs")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: one GPU per process when there are enough, else the CPU")
    ap.add_argument("--dim", type=int, default=32, help="MLP input and output width")
    ap.add_argument("--hidden", type=int, default=128, help="MLP hidden width")
    ap.add_argument("--layers", type=int, default=3, help="number of Linear layers (>= 2)")
    ap.add_argument("--global-batch", type=int, default=16, help="global batch of the correctness check")
    ap.add_argument("--check-steps", type=int, default=4, help="SGD steps compared with one process")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch-per-rank", type=int, default=32, help="per-rank batch of the throughput run")
    ap.add_argument("--steps", type=int, default=20, help="timed training steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP gradient bucket size (MB)")
    ap.add_argument("--allreduce-bytes", type=str, default="",
                    help="comma-separated message sizes in bytes for the all-reduce sweep ('' skips it)")
    ap.add_argument("--allreduce-iters", type=int, default=10, help="timed all-reduces per size and repeat")
    ap.add_argument("--allreduce-warmup", type=int, default=10, help="untimed all-reduces per size first")
    ap.add_argument("--allreduce-repeats", type=int, default=5, help="timed repeats per size (median reported)")
    ap.add_argument("--accum-steps", type=int, default=2, help="micro-batches per rank in the no_sync check")
    ap.add_argument("--bucket-sweep", type=str, default="",
                    help="comma-separated bucket_cap_mb values to time a DDP step with ('' skips it)")
    ap.add_argument("--trace", type=Path, default=None,
                    help="rank 0 profiles a few DDP steps and writes a Chrome trace here")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads per process (0: cores / processes - 1, leaving each a core for gloo's threads)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.layers < 2:
        ap.error("--layers must be at least 2")
    for name in ("dim", "hidden", "global_batch", "check_steps", "batch_per_rank", "steps", "allreduce_iters",
                 "allreduce_repeats", "accum_steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


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


def make_model(dim: int, hidden: int, layers: int) -> nn.Sequential:
    """An MLP dim -> hidden -> ... -> dim with ReLU between the Linear layers."""
    widths = [dim] + [hidden] * (layers - 1) + [dim]
    mods: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        mods.append(nn.Linear(a, b))
        if i < layers - 1:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def global_batch(step: int, n: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same (x, y) on every rank for a given step: a regression onto a fixed random map."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    teacher = torch.Generator().manual_seed(seed + 7)
    w = torch.randn(dim, dim, generator=teacher) / math.sqrt(dim)
    x = torch.randn(n, dim, generator=g)
    return x, torch.tanh(x @ w) + 0.1 * torch.randn(n, dim, generator=g)


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def checksum(model: nn.Module) -> torch.Tensor:
    """One float64 number that changes when any parameter changes (a weighted sum)."""
    flat = flat_params(model)
    weights = torch.cos(torch.arange(flat.numel(), dtype=torch.float64, device=flat.device))
    return (flat * weights).sum()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(seconds: float, device: torch.device) -> float:
    """The largest value over all ranks (the step is done when the slowest rank is)."""
    import torch.distributed as dist
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def timed_on_slowest_rank(fn, calls: int, device: torch.device) -> float:
    """Seconds that `calls` calls of fn take on the slowest rank, the ranks lined up first."""
    _sync(device)
    _slowest(0.0, device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return _slowest(time.perf_counter() - t0, device)


def _max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))


def accumulate_no_sync(ddp, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Gradient accumulation under DDP: backward on every micro-batch, all-reduce only on the last.

    Inside `ddp.no_sync()` DDP's hooks do not fire, so gradients add up locally in .grad; the last
    backward (outside it) all-reduces the sum once. Each loss is divided by the number of
    micro-batches so the result is the mean over all of them, like one big batch.
    """
    *first, last = micro_batches
    with ddp.no_sync():
        for x, y in first:
            (F.mse_loss(ddp(x), y) / len(micro_batches)).backward()   # local only: no communication
    x, y = last
    (F.mse_loss(ddp(x), y) / len(micro_batches)).backward()           # adds, then all-reduces the sum


def check_correctness(args, rank: int, world: int, device: torch.device) -> dict:
    """DDP on the split global batch vs one process on all of it; gradients by accumulation too."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    if args.global_batch % world:
        raise ValueError(f"--global-batch {args.global_batch} does not split evenly over {world} processes: "
                         f"use a multiple of {world}.")
    local = args.global_batch // world
    torch.manual_seed(args.seed)
    model = make_model(args.dim, args.hidden, args.layers).to(device)
    init = copy.deepcopy(model)  # every rank builds the same start; DDP also broadcasts rank 0's
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
              bucket_cap_mb=args.bucket_cap_mb)
    buckets: list[dict] = []

    def counting_hook(state, bucket):  # the default all-reduce, noting each bucket it is given
        buckets.append({"index": bucket.index(), "bytes": bucket.buffer().numel() * bucket.buffer().element_size(),
                        "params": len(bucket.parameters())})
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    losses, ddp_grads, last_buckets = [], None, []
    for step in range(args.check_steps):
        x, y = global_batch(step, args.global_batch, args.dim, args.seed)
        xs, ys = x[rank * local:(rank + 1) * local].to(device), y[rank * local:(rank + 1) * local].to(device)
        buckets.clear()
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(ddp(xs), ys)
        loss.backward()  # DDP all-reduces (averages) each bucket of gradients as it fills
        if step == 0:
            ddp_grads = [p.grad.detach().clone() for p in model.parameters()]
            first_buckets = len(buckets)   # a fresh DDP's first backward (before it regroups its buckets)
        opt.step()
        last_buckets = list(buckets)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)  # equal shards: the mean of the shard means is the global mean
        losses.append(float(mean_loss.item()) / world)

    out = {"ddp_losses": losses, "buckets": sorted(last_buckets, key=lambda b: b["index"]),
           "param_count": sum(p.numel() for p in model.parameters())}

    # no_sync: `accum_steps` micro-batches per rank, one all-reduce, from a fresh copy of the start
    nosync_model = copy.deepcopy(init).to(device)
    nosync = DDP(nosync_model, device_ids=[device.index] if device.type == "cuda" else None,
                 bucket_cap_mb=args.bucket_cap_mb)
    nosync.register_comm_hook(None, counting_hook)
    buckets.clear()
    acc_global = args.accum_steps * args.global_batch
    xa, ya = global_batch(10_000, acc_global, args.dim, args.seed)
    per = args.global_batch // world   # micro-batch size; rank r takes micro-batches r, r + world, ...
    mine = [(xa[i * per:(i + 1) * per].to(device), ya[i * per:(i + 1) * per].to(device))
            for i in range(rank, args.accum_steps * world, world)]
    accumulate_no_sync(nosync, mine)
    out["nosync_allreduce_calls"] = len(buckets)
    out["nosync_buckets_per_backward"] = first_buckets
    nosync_grads = [p.grad.detach().clone() for p in nosync_model.parameters()]
    # identical parameters on every rank: a checksum per rank, gathered, and rank 0's values broadcast
    sums = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(world)]
    dist.all_gather(sums, checksum(model).reshape(1))
    out["rank_checksums"] = [float(s.item()) for s in sums]
    out["checksum_spread"] = max(out["rank_checksums"]) - min(out["rank_checksums"])
    mine = flat_params(model)
    theirs = mine.clone()
    dist.broadcast(theirs, src=0)
    worst = (mine - theirs).abs().max().reshape(1)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    out["max_param_diff_across_ranks"] = float(worst.item())

    if rank == 0:  # the single-process reference on the global batch, same start, same steps
        ref = copy.deepcopy(init)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=args.lr)
        ref_losses = []
        for step in range(args.check_steps):
            x, y = global_batch(step, args.global_batch, args.dim, args.seed)
            ref_opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(ref(x.to(device)), y.to(device))
            loss.backward()
            if step == 0:
                full_grads = [p.grad.detach().clone() for p in ref.parameters()]
            ref_opt.step()
            ref_losses.append(float(loss.item()))
        # the same gradient by accumulation: `world` micro-batches one after another on one device
        acc = copy.deepcopy(init)
        x, y = global_batch(0, args.global_batch, args.dim, args.seed)
        for r in range(world):
            part = slice(r * local, (r + 1) * local)
            (F.mse_loss(acc(x[part].to(device)), y[part].to(device)) / world).backward()
        acc_grads = [p.grad.detach() for p in acc.parameters()]
        big = copy.deepcopy(init)   # the no_sync reference: one process, all accum_steps x global batch at once
        F.mse_loss(big(xa.to(device)), ya.to(device)).backward()
        out["grad_diff_nosync_vs_full"] = _max_abs_diff(nosync_grads, [p.grad.detach() for p in big.parameters()])
        out.update({
            "ref_losses": ref_losses,
            "max_loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
            "max_param_diff_vs_ref": float((flat_params(model) - flat_params(ref)).abs().max()),
            "grad_diff_ddp_vs_full": _max_abs_diff(ddp_grads, full_grads),
            "grad_diff_accum_vs_full": _max_abs_diff(acc_grads, full_grads),
            "grad_diff_ddp_vs_accum": _max_abs_diff(ddp_grads, acc_grads),
            "grad_max_abs": max(float(g.abs().max()) for g in full_grads),
        })
    return out


def bucket_bytes(ddp) -> list[int]:
    """The sizes (bytes) of the gradient buckets a DDP model all-reduces each step, in the order it fills them
    (after its first backward, DDP regroups its buckets in the order gradients become ready)."""
    found = compat.ddp_bucket_sizes(ddp)
    return found or [sum(p.numel() * p.element_size() for p in ddp.parameters())]


def bucket_comm_fn(sizes: list[int], world: int, device: torch.device):
    """DDP's communication without its compute, as (start, finish): start copies each bucket's gradients in,
    divides them by the ranks and starts its all-reduce; finish waits for each and copies the result back out.
    What DDP adds to a step besides its hooks; `finish(start())` runs it alone."""
    import torch.distributed as dist

    bufs = [torch.zeros(max(1, n // 4), dtype=torch.float32, device=device) for n in sizes]
    grads = [torch.randn(b.numel(), device=device) for b in bufs]

    def start():
        works = []
        for b, g in zip(bufs, grads):
            b.copy_(g)
            b.div_(world)
            works.append(dist.all_reduce(b, async_op=True))
        return works

    def finish(works) -> None:
        for w, b, g in zip(works, bufs, grads):
            w.wait()
            g.copy_(b)

    return start, finish


def _ms(seconds: list[float]) -> list[float]:
    return [s * 1e3 for s in seconds]


def measure_throughput(args, rank: int, world: int, device: torch.device) -> dict:
    """Samples/s of DDP training on a fixed per-rank batch, the parts of its step measured one by one, and the
    cost of one gradient two ways. Every time is a list of samples (ms), one per step, the slowest rank's."""
    import torch.distributed as dist

    torch.manual_seed(args.seed)
    single = make_model(args.dim, args.hidden, args.layers).to(device)  # the same start as the DDP model
    ddp, step, x, y = _ddp_step_fn(args, rank, device, args.bucket_cap_mb, data_seed=1000)
    local, local_step, _, _ = _ddp_step_fn(args, rank, device, args.bucket_cap_mb, data_seed=1000)
    plain = copy.deepcopy(single)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=args.lr * 0.1)

    def plain_step():
        plain_opt.zero_grad(set_to_none=True)
        F.mse_loss(plain(x), y).backward()
        plain_opt.step()

    def compute():   # the DDP step without its communication: inside no_sync, DDP's hooks return at once
        with local.no_sync():
            local_step()

    out = {"steps": args.steps, "batch_per_rank": args.batch_per_rank,
           "grad_bytes": sum(p.numel() * p.element_size() for p in plain.parameters())}
    if rank == 0:  # the baseline: one device, a plain model (no DDP), the same batch; the other ranks wait
        for _ in range(args.warmup):
            plain_step()
        alone = []
        for _ in range(args.steps):
            _sync(device)
            t0 = time.perf_counter()
            plain_step()
            _sync(device)
            alone.append(time.perf_counter() - t0)
        out["single_samples_ms"] = _ms(alone)
        out["single_step_ms"] = statistics.median(alone) * 1e3
        out["single_samples_per_s"] = args.batch_per_rank / statistics.median(alone)
    dist.barrier()

    for _ in range(max(3, args.warmup + 1)):   # the first steps also let DDP regroup its buckets in use order
        step()
    out["bucket_bytes"] = bucket_bytes(ddp)
    start, finish = bucket_comm_fn(out["bucket_bytes"], world, device)

    def comm():
        finish(start())

    def together():   # the communication started, then the compute, then the communication finished: overlap by hand
        works = start()
        compute()
        finish(works)

    def backward_alone():
        local.zero_grad(set_to_none=True)
        with local.no_sync():
            loss = F.mse_loss(local(x), y)   # forward untimed
            return timed_on_slowest_rank(loss.backward, 1, device)

    for _ in range(args.warmup):
        compute()
        comm()
        together()
    # interleaved, so that each part sees the same conditions. Every rank runs each part at the same time, sharing
    # the machine as the DDP ranks do: the DDP step; the same step without communication (compute); its backward
    # alone; DDP's communication alone; and communication and compute started together (overlap by hand)
    parts: dict[str, list[float]] = {"step": [], "compute": [], "backward": [], "comm": [], "together": []}
    for _ in range(args.steps):
        parts["step"].append(timed_on_slowest_rank(step, 1, device))
        parts["compute"].append(timed_on_slowest_rank(compute, 1, device))
        parts["backward"].append(backward_alone())
        parts["comm"].append(timed_on_slowest_rank(comm, 1, device))
        parts["together"].append(timed_on_slowest_rank(together, 1, device))
    for k, v in parts.items():
        out[f"{k}_samples_ms"] = _ms(v)
        out[f"{k}_ms"] = statistics.median(v) * 1e3
    out["samples_per_s"] = world * args.batch_per_rank / statistics.median(parts["step"])
    if rank == 0:
        out["scaling_efficiency"] = out["samples_per_s"] / (world * out["single_samples_per_s"])

    # one gradient of the global batch (world x batch_per_rank): DDP (one micro-batch per rank, in
    # parallel, plus an all-reduce) vs accumulation (every micro-batch in turn on rank 0, no talk)
    def ddp_grad():
        ddp.zero_grad(set_to_none=True)
        F.mse_loss(ddp(x), y).backward()

    def accum_grad():
        single.zero_grad(set_to_none=True)
        for _ in range(world):
            (F.mse_loss(single(x), y) / world).backward()

    reps = max(5, args.steps // 2)
    ddp_times = [timed_on_slowest_rank(ddp_grad, 1, device) for _ in range(reps)]
    out["ddp_grad_ms"] = statistics.median(ddp_times) * 1e3
    if rank == 0:
        accum_grad()
        acc_times = []
        for _ in range(reps):
            _sync(device)
            t0 = time.perf_counter()
            accum_grad()
            _sync(device)
            acc_times.append(time.perf_counter() - t0)
        out["accum_grad_ms"] = statistics.median(acc_times) * 1e3
    dist.barrier()

    sums = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(world)]
    dist.all_gather(sums, checksum(ddp.module).reshape(1))
    out["checksum_spread"] = max(float(s.item()) for s in sums) - min(float(s.item()) for s in sums)
    return out


def _ddp_step_fn(args, rank: int, device: torch.device, bucket_cap_mb: float, data_seed: int = 2000):
    """A fresh DDP model (seeded with args.seed), its training step on a fixed per-rank batch, and that batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(args.seed)
    ddp = DDP(make_model(args.dim, args.hidden, args.layers).to(device),
              device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr * 0.1)
    g = torch.Generator().manual_seed(args.seed + data_seed + rank)
    x = torch.randn(args.batch_per_rank, args.dim, generator=g).to(device)
    y = torch.randn(args.batch_per_rank, args.dim, generator=g).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(ddp(x), y).backward()
        opt.step()

    return ddp, step, x, y


def bucket_sweep(args, rank: int, device: torch.device) -> list[dict]:
    """DDP step time (slowest rank; median, p20, p80 and every sample) for each bucket_cap_mb in --bucket-sweep,
    with the buckets DDP made. The sizes take turns, step by step, so a change in the machine's load reaches all."""
    caps = [float(c) for c in args.bucket_sweep.split(",") if c.strip()]
    runs = []
    for cap in caps:
        ddp, step, _, _ = _ddp_step_fn(args, rank, device, cap)
        for _ in range(max(3, args.warmup + 1)):   # the first steps also let DDP rebuild its buckets in use order
            step()
        runs.append((ddp, step, []))
    for _ in range(args.steps):
        for _, step, times in runs:
            times.append(timed_on_slowest_rank(step, 1, device))
    rows = []
    for cap, (ddp, _, times) in zip(caps, runs):
        ms = _ms(times)
        rows.append({"bucket_cap_mb": cap, "step_ms": statistics.median(ms), "p20_ms": quantile(ms, 0.2),
                     "p80_ms": quantile(ms, 0.8), "samples_ms": ms, "bucket_bytes": bucket_bytes(ddp)})
    del runs
    return rows


def is_allreduce(name: str, on_gpu: bool) -> bool:
    """An all-reduce's work in a profile: an NCCL kernel on a GPU, gloo's op on a CPU (not the launch)."""
    low = name.lower()
    return "allreduce" in low and "nccl" in low if on_gpu else low == "gloo:all_reduce"


def trace_steps(args, rank: int, device: torch.device, path: Path, steps: int = 6) -> dict:
    """Profile a few DDP steps; rank 0 writes a Chrome trace to `path` and returns the intervals (us) of backward's
    compute and of the all-reduces in the last profiled step, and for every profiled step how long backward's
    compute went on after the first all-reduce started (`leads_ms`: negative when it started after)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    ddp, step, _, _ = _ddp_step_fn(args, rank, device, args.bucket_cap_mb)
    for _ in range(max(3, args.warmup + 1)):
        step()
    _sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            with record_function(f"step {i}"):
                step()
            _sync(device)
    found = {}
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        events = prof.events()
        found = intervals(events, device.type)
        found["leads_ms"] = []
        for i in range(steps):
            one = intervals(events, device.type, which=i)
            if one["compute"] and one["allreduce"]:
                lead = max(c[1] for c in one["compute"]) - min(c[0] for c in one["allreduce"])
                found["leads_ms"].append(lead / 1e3)
        found["bucket_bytes"] = bucket_bytes(ddp)
    import torch.distributed as dist
    dist.barrier()
    return found


def intervals(events, device_type: str, which: int = -1) -> dict:
    """From profiler events: [start, end] (us, from that step's start) of compute and all-reduces in the profiled
    step `which` (the last by default).

    On a GPU: NCCL all-reduce kernels vs every other kernel. On a CPU: gloo's all-reduce ops vs the
    autograd functions of backward (host events).
    """
    steps = sorted((e for e in events if e.name.startswith("step ")), key=lambda e: e.time_range.start)
    if not steps:
        return {"compute": [], "allreduce": []}
    gpu = device_type == "cuda"
    lo, hi = steps[which].time_range.start, steps[which].time_range.end
    nxt = steps[which + 1].time_range.start if which != -1 and which + 1 < len(steps) else None
    compute, comm = [], []
    for e in events:
        on_device = "cuda" in str(getattr(e, "device_type", "")).lower()
        start, end = e.time_range.start, e.time_range.end
        if gpu != on_device or start < lo or (not gpu and start > hi) or (nxt is not None and start >= nxt):
            continue
        if is_allreduce(e.name, gpu):
            comm.append([start - lo, end - lo])
        elif gpu or "backward" in e.name.lower():
            compute.append([start - lo, end - lo])
    if gpu:   # kernels run after their launches: keep those that start before the step's last all-reduce ends
        last = max([hi] + [c[1] + lo for c in comm])
        compute = [c for c in compute if c[0] + lo <= last]
    return {"compute": sorted(compute), "allreduce": sorted(comm)}


def measure_allreduce(args, world: int, device: torch.device) -> list[dict]:
    """Time of one all-reduce (sum) per message size; algorithm and bus bandwidth (nccl-tests)."""
    import torch.distributed as dist

    sizes = [int(s) for s in args.allreduce_bytes.split(",") if s.strip()]
    bufs = [torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device) for nbytes in sizes]
    for buf in bufs:
        for _ in range(args.allreduce_warmup):   # the first calls set up connections and buffers
            dist.all_reduce(buf)
    times: list[list[float]] = [[] for _ in bufs]
    for _ in range(args.allreduce_repeats):   # the sizes take turns, so that a change in load reaches all of them
        for buf, ts in zip(bufs, times):
            ts.append(timed_on_slowest_rank(lambda b=buf: dist.all_reduce(b), args.allreduce_iters, device)
                      / args.allreduce_iters)
    rows = []
    for buf, ts in zip(bufs, times):
        seconds = statistics.median(ts)
        size = buf.numel() * 4
        algbw = size / seconds / 1e9
        rows.append({"bytes": size, "us": seconds * 1e6, "p20_us": quantile(ts, 0.2) * 1e6,
                     "p80_us": quantile(ts, 0.8) * 1e6, "samples_us": [t * 1e6 for t in ts], "algbw_gbps": algbw,
                     "busbw_gbps": algbw * 2 * (world - 1) / world})
    del bufs
    return rows


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print(f"labkit.ddp_train: no RANK/WORLD_SIZE in the environment: {USAGE}", file=sys.stderr)
        return 2
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        backend, dev_type = choose(args.backend, args.device, local_world, gpus)
    except ValueError as exc:
        print(f"labkit.ddp_train: {exc}", file=sys.stderr)
        return 2
    device = init_group(backend, dev_type, local_rank, args.threads or default_threads(local_world))
    try:
        result = {"world_size": world, "backend": backend, "device": dev_type, "torch": torch.__version__,
                  "threads": torch.get_num_threads(), "cores": os.cpu_count(),
                  "hosts": None, "args": {k: str(v) for k, v in vars(args).items()}}
        hosts = [None] * world
        dist.all_gather_object(hosts, f"{platform.node()}:{device}")
        result["hosts"] = hosts
        result["check"] = check_correctness(args, rank, world, device)
        result["throughput"] = measure_throughput(args, rank, world, device)
        result["allreduce"] = measure_allreduce(args, world, device) if args.allreduce_bytes and world > 1 else []
        result["bucket_sweep"] = bucket_sweep(args, rank, device) if args.bucket_sweep else []
        result["trace"] = trace_steps(args, rank, device, args.trace) if args.trace else {}
        if rank == 0:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))
            c, t = result["check"], result["throughput"]
            print(f"[rank 0/{world}] {backend} on {dev_type}: {t['samples_per_s']:,.0f} samples/s, "
                  f"loss diff vs 1 process {c['max_loss_diff']:.2e}, "
                  f"param diff across ranks {c['max_param_diff_across_ranks']:.2e}; wrote {args.out}")
    finally:
        dist.destroy_process_group()
    return 0


def exit_rank(code: int) -> None:
    """End a torchrun worker after its work, skipping C++ static destructors: a gloo or profiler thread still
    joinable at interpreter exit aborts the process ("terminate called without an active exception")."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_rank(main())
