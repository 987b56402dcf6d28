"""The timed parts of a DDP run (labkit.parallel.ddp): throughput against one process, the parts of a step
timed one by one, gradient buckets, a bucket-size sweep, a profiler trace of a few steps, and the all-reduce
bandwidth sweep. Every time is the slowest rank's, the ranks lined up first.

Used by: notebook 08 (through labkit.parallel.ddp).
"""
from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from labkit import compat
from labkit.parallel.launch import timed_on_slowest_rank
from labkit.stats import quantile
from labkit.timing import sync
from labkit.parallel.mlp import checksum, make_model


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


def loss_of(model, x: torch.Tensor, y: torch.Tensor, args) -> torch.Tensor:
    """The MSE loss of model(x): with --autocast bf16 its forward runs in bf16 (autocast), as mixed-precision
    training does, while the parameters, and so the gradients DDP all-reduces, stay fp32."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=getattr(args, "autocast", "none") == "bf16"):
        out = model(x)
    return F.mse_loss(out.float(), y)


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
    grad_bytes = sum(p.numel() * p.element_size() for p in single.parameters())
    one, step_one, _, _ = _ddp_step_fn(args, rank, device, 2 * grad_bytes / 2**20 + 1, data_seed=1000)  # one bucket
    plain = copy.deepcopy(single)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=args.lr * 0.1)

    def plain_step():
        plain_opt.zero_grad(set_to_none=True)
        loss_of(plain, x, y, args).backward()
        plain_opt.step()

    def compute():   # the DDP step without its communication: inside no_sync, DDP's hooks return at once
        with local.no_sync():
            local_step()

    out = {"steps": args.steps, "batch_per_rank": args.batch_per_rank, "grad_bytes": grad_bytes}
    if rank == 0:  # the baseline: one device, a plain model (no DDP), the same batch; the other ranks wait
        for _ in range(args.warmup):
            plain_step()
        alone = []
        for _ in range(args.steps):
            sync(device)
            t0 = time.perf_counter()
            plain_step()
            sync(device)
            alone.append(time.perf_counter() - t0)
        out["single_samples_ms"] = _ms(alone)
        out["single_step_ms"] = statistics.median(alone) * 1e3
        out["single_samples_per_s"] = args.batch_per_rank / statistics.median(alone)
    dist.barrier()

    for _ in range(max(3, args.warmup + 1)):   # the first steps also let DDP regroup its buckets in use order
        step()
        step_one()
    out["bucket_bytes"] = bucket_bytes(ddp)
    out["one_bucket_bytes"] = bucket_bytes(one)
    start, finish = bucket_comm_fn(out["bucket_bytes"], world, device)
    start_one, finish_one = bucket_comm_fn([sum(out["bucket_bytes"])], world, device)

    def comm():
        finish(start())

    def comm_one():   # all the gradients in one bucket: its copies in and out, one all-reduce
        finish_one(start_one())

    def together():   # the communication started, then the compute, then the communication finished: overlap by hand
        works = start()
        compute()
        finish(works)

    def backward_alone():
        local.zero_grad(set_to_none=True)
        with local.no_sync():
            loss = loss_of(local, x, y, args)   # forward untimed
            return timed_on_slowest_rank(loss.backward, 1, device)

    for _ in range(args.warmup):
        compute()
        comm()
        comm_one()
        together()
    # interleaved, so that each part sees the same conditions. Every rank runs each part at the same time, sharing
    # the machine as the DDP ranks do: the DDP step, and the step of a DDP with one bucket for all the gradients;
    # the same step without communication (compute); its backward alone; DDP's communication alone, and that of
    # one bucket; and communication and compute started together (overlap by hand)
    parts: dict[str, list[float]] = {"step": [], "step_one": [], "compute": [], "backward": [], "comm": [],
                                     "comm_one": [], "together": []}
    for _ in range(args.steps):
        parts["step"].append(timed_on_slowest_rank(step, 1, device))
        parts["step_one"].append(timed_on_slowest_rank(step_one, 1, device))
        parts["compute"].append(timed_on_slowest_rank(compute, 1, device))
        parts["backward"].append(backward_alone())
        parts["comm"].append(timed_on_slowest_rank(comm, 1, device))
        parts["comm_one"].append(timed_on_slowest_rank(comm_one, 1, device))
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
        loss_of(ddp, x, y, args).backward()

    def accum_grad():
        single.zero_grad(set_to_none=True)
        for _ in range(world):
            (loss_of(single, x, y, args) / world).backward()

    reps = max(5, args.steps // 2)
    ddp_times = [timed_on_slowest_rank(ddp_grad, 1, device) for _ in range(reps)]
    out["ddp_grad_ms"] = statistics.median(ddp_times) * 1e3
    if rank == 0:
        accum_grad()
        acc_times = []
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            accum_grad()
            sync(device)
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
        loss_of(ddp, x, y, args).backward()
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


def trace_steps(args, rank: int, device: torch.device, path: Path, steps: int = 12) -> dict:
    """Profile a few DDP steps; rank 0 writes a Chrome trace to `path` and returns the intervals (us) of backward's
    compute and of the all-reduces in the last profiled step, and for every profiled step how long backward's
    compute went on after the first all-reduce started (`leads_ms`: negative when it started after). Then as many
    steps without communication (under no_sync): `compute_busy_ms` holds, per step, the time the compute kernels
    (on a CPU: backward's ops) ran in either kind of step, so that what the all-reduces running beside them cost
    the compute shows."""
    from torch.profiler import ProfilerActivity, profile, record_function

    ddp, step, _, _ = _ddp_step_fn(args, rank, device, args.bucket_cap_mb)

    def quiet_step():
        with ddp.no_sync():
            step()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    profiled = {}
    for kind, fn in (("ddp", step), ("no_sync", quiet_step)):
        for _ in range(max(3, args.warmup + 1)):
            fn()
        sync(device)
        with profile(activities=activities) as prof:
            for i in range(steps):
                with record_function(f"step {i}"):
                    fn()
                sync(device)
        profiled[kind] = prof
    found = {}
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        profiled["ddp"].export_chrome_trace(str(path))
        events = {kind: prof.events() for kind, prof in profiled.items()}
        per_step = {kind: [intervals(evs, device.type, which=i) for i in range(steps)]
                    for kind, evs in events.items()}  # each step's intervals, found once
        found = intervals(events["ddp"], device.type)
        found["leads_ms"] = [(max(c[1] for c in one["compute"]) - min(c[0] for c in one["allreduce"])) / 1e3
                             for one in per_step["ddp"] if one["compute"] and one["allreduce"]]
        found["compute_busy_ms"] = {
            kind: [b for b in (sum(e - a for a, e in one["compute"]) / 1e3 for one in ones) if b > 0]
            for kind, ones in per_step.items()}
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
