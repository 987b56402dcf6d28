"""Train a small MLP with DistributedDataParallel and write what happened as JSON (rank 0).

Launch one process per device with torchrun (gloo on CPUs, NCCL on GPUs):

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m labkit.parallel.ddp --out r.json

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

Used by: notebook 08.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from labkit.parallel import launch
from labkit.parallel.launch import exit_rank
from labkit.parallel.ddp_timing import bucket_sweep, measure_allreduce, measure_throughput, trace_steps
from labkit.parallel.mlp import checksum, flat_params, global_batch, make_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="labkit.parallel.ddp", description=__doc__.split("\n\n")[0])
    launch.add_common(ap, threads=0)
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
    ap.add_argument("--autocast", choices=("none", "bf16"), default="none",
                    help="the timed steps' forward under bf16 autocast (parameters and gradients stay fp32); the "
                         "correctness check always runs in fp32")
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
    args = ap.parse_args(argv)
    if args.layers < 2:
        ap.error("--layers must be at least 2")
    for name in ("dim", "hidden", "global_batch", "check_steps", "batch_per_rank", "steps", "allreduce_iters",
                 "allreduce_repeats", "accum_steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        ctx = launch.start(args, "labkit.parallel.ddp")
    except SystemExit as exc:  # not under torchrun, or a device it cannot use: say so, exit 2
        print(exc.code, file=sys.stderr)
        return 2
    import torch.distributed as dist

    rank, world, device = ctx.rank, ctx.world, ctx.device
    try:
        result = {"threads": torch.get_num_threads(), "cores": os.cpu_count(),
                  "args": {k: str(v) for k, v in vars(args).items()}}
        result["check"] = check_correctness(args, rank, world, device)
        result["throughput"] = measure_throughput(args, rank, world, device)
        result["allreduce"] = measure_allreduce(args, world, device) if args.allreduce_bytes and world > 1 else []
        result["bucket_sweep"] = bucket_sweep(args, rank, device) if args.bucket_sweep else []
        result["trace"] = trace_steps(args, rank, device, args.trace) if args.trace else {}
        launch.finish(ctx, result, args.out)
        if rank == 0:
            c, t = result["check"], result["throughput"]
            print(f"[rank 0/{world}] {ctx.backend} on {device.type}: {t['samples_per_s']:,.0f} samples/s, "
                  f"loss diff vs 1 process {c['max_loss_diff']:.2e}, "
                  f"param diff across ranks {c['max_param_diff_across_ranks']:.2e}; wrote {args.out}")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_rank(main())
