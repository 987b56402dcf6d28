"""Sharded data parallelism: FSDP2 (`fully_shard`) against DDP on the same model, memory and traffic counted.

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m labkit.parallel.fsdp --out r.json

DDP keeps every parameter, gradient and optimizer state on every rank. ZeRO shards them over the N
ranks: stage 1 the optimizer state, stage 2 the gradients too, stage 3 the parameters too. FSDP2
is stage 3: each block's parameters live as 1/N shards; before the block runs, an all-gather
builds the whole block, afterwards it is freed; backward all-gathers again and reduce-scatters the
gradients, so each rank keeps only its shard's gradient. This script trains the same MLP stack both
ways with Adam, checks they give the same parameters, counts every rank's bytes and every collective's.

Used by: notebook 10.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit.parallel import launch
from labkit.parallel.tensor_parallel import MLP, _timed
from labkit.stats import quantile

PROG = "labkit.parallel.fsdp"


def make_model(dim: int, blocks: int) -> nn.Sequential:
    """`blocks` MLP blocks d -> 4d -> d (the tensor-parallel notebook's block), one after another."""
    return nn.Sequential(*[MLP(dim, 4 * dim) for _ in range(blocks)])


def zero_bytes(params: int, world: int, param_bytes: int = 2, grad_bytes: int = 2, state_bytes: int = 12) -> dict:
    """Bytes per rank for DDP and ZeRO-1/2/3: (params, grads, optimizer state) with what each stage shards.

    Mixed-precision Adam (the ZeRO paper): bf16 params 2, bf16 grads 2, fp32 master + m + v 12 bytes/param.
    Plain fp32 Adam: 4, 4, 8.
    """
    P, G, S, n = param_bytes * params, grad_bytes * params, state_bytes * params, world
    rows = {"DDP": (P, G, S), "ZeRO-1": (P, G, S / n), "ZeRO-2": (P, G / n, S / n), "ZeRO-3": (P / n, G / n, S / n)}
    return {k: {"params": v[0], "grads": v[1], "optimizer": v[2], "total": sum(v)} for k, v in rows.items()}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def held_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """What this rank holds: its parameters, gradients and optimizer state, in bytes (shards for FSDP)."""
    def nbytes(ts) -> int:
        return sum(_local(t).numel() * _local(t).element_size() for t in ts)

    states = getattr(opt, "optim", opt).state.values()   # ZeroRedundancyOptimizer keeps its local optimizer in .optim
    out = {"params": nbytes(model.parameters()),
           "grads": nbytes(p.grad for p in model.parameters() if p.grad is not None),
           "optimizer": nbytes(v for s in states for v in s.values() if torch.is_tensor(v) and v.dim() > 0)}
    out["total"] = sum(out.values())
    return out


@contextlib.contextmanager
def counting_collectives(tally: dict):
    """Count the all-gathers and reduce-scatters FSDP2 issues (it calls them through torch.distributed).

    Newer PyTorch names them all_gather_single / reduce_scatter_single, older all_gather_into_tensor /
    reduce_scatter_tensor; whichever exist are wrapped, and a call made inside another counts once.
    """
    names = {"all_gather_single": ("all_gather", 0), "all_gather_into_tensor": ("all_gather", 0),
             "reduce_scatter_single": ("reduce_scatter", 1), "reduce_scatter_tensor": ("reduce_scatter", 1)}
    saved = {n: getattr(dist, n) for n in names if hasattr(dist, n)}
    depth = [0]

    def wrap(fn, kind, pos):
        def counted(*a, **k):
            if depth[0] == 0:   # the full-size tensor: the gather's output, the scatter's input
                full = k.get(("output", "input")[pos], k.get(("output_tensor", "input_tensor")[pos]))
                full = a[pos] if full is None else full
                tally[kind] = tally.get(kind, 0) + 1
                tally[kind + "_bytes"] = tally.get(kind + "_bytes", 0) + full.numel() * full.element_size()
            depth[0] += 1
            try:
                return fn(*a, **k)
            finally:
                depth[0] -= 1
        return counted

    for n, fn in saved.items():
        setattr(dist, n, wrap(fn, *names[n]))
    try:
        yield tally
    finally:
        for n, fn in saved.items():
            setattr(dist, n, fn)


def build(kind: str, model: nn.Module, ctx: launch.Ctx, lr: float, mp: bool = False):
    """(module, optimizer) for kind in DDP, ZeRO-1 (DDP + ZeroRedundancyOptimizer), FSDP (fully_shard)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    m = copy.deepcopy(model).to(ctx.device)
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    if kind == "FSDP":
        from torch.distributed.device_mesh import init_device_mesh
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mp
                  else MixedPrecisionPolicy())
        # an explicit mesh on this run's device: fully_shard's default takes CUDA whenever a GPU exists
        mesh = init_device_mesh(ctx.device.type, (ctx.world,))
        for block in m:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(m, mesh=mesh, mp_policy=policy)
        return m, torch.optim.Adam(m.parameters(), lr=lr)
    ddp = DDP(m, device_ids=ids)
    if kind == "ZeRO-1":
        return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
    return ddp, torch.optim.Adam(ddp.parameters(), lr=lr)


def batch(step: int, n: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 7919 + step)
    return torch.randn(n, dim, generator=g), torch.randn(n, dim, generator=g)


def train(kind: str, model: nn.Module, args, ctx: launch.Ctx, mp: bool = False) -> dict:
    """A few Adam steps on this rank's share of each global batch; losses, final full parameters, bytes held,
    traffic."""
    mod, opt = build(kind, model, ctx, args.lr, mp)
    local = args.global_batch // ctx.world
    losses, tally, peak = [], {}, 0
    ddp_bytes = [0]
    if kind != "FSDP":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
            allreduce_hook,
        )

        def hook(state, bucket):
            ddp_bytes[0] += bucket.buffer().numel() * bucket.buffer().element_size()
            return allreduce_hook(state, bucket)
        mod.register_comm_hook(None, hook)
    for step in range(args.steps):
        x, y = batch(step, args.global_batch, args.dim, args.seed)
        x, y = (x[ctx.rank * local:(ctx.rank + 1) * local].to(ctx.device),
                y[ctx.rank * local:(ctx.rank + 1) * local].to(ctx.device))
        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)
        tally.clear()
        ddp_bytes[0] = 0
        with counting_collectives(tally):
            opt.zero_grad(set_to_none=False)
            loss = F.mse_loss(mod(x).float(), y)
            loss.backward()
            opt.step()
        if ctx.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(ctx.device)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / ctx.world)
    full = torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1).double().cpu()
                      for p in mod.parameters()])
    out = {"losses": losses, "held": held_bytes(mod, opt), "traffic": dict(tally), "params": full}
    if kind != "FSDP":
        out["traffic"] = {"all_reduce": 1, "all_reduce_bytes": ddp_bytes[0]}
    if ctx.device.type == "cuda":
        out["cuda_allocated"], out["cuda_peak"] = torch.cuda.memory_allocated(ctx.device), peak
    out["step_ms"] = _time(mod, opt, args, ctx, local)
    del mod, opt
    gc.collect()   # DDP/FSDP hold reference cycles: free them now, while the process group lives
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _time(mod, opt, args, ctx: launch.Ctx, local: int) -> list[float]:
    """Step time in ms over repeats (the slowest rank's each time), sorted."""
    x, y = batch(99, local, args.dim, args.seed + ctx.rank)
    x, y = x.to(ctx.device), y.to(ctx.device)

    def step():
        opt.zero_grad(set_to_none=False)
        F.mse_loss(mod(x).float(), y).backward()
        opt.step()

    return [s * 1e3 for s in _timed(step, args.iters, args.repeats, ctx.device)]


def body(args, ctx: launch.Ctx) -> dict:
    if args.global_batch % ctx.world:
        sys.exit(f"{PROG}: --global-batch {args.global_batch} does not split over {ctx.world} ranks: "
                 f"use a multiple of {ctx.world}")
    torch.manual_seed(args.seed)
    model = make_model(args.dim, args.blocks)
    n_params = sum(p.numel() for p in model.parameters())
    runs = {kind: train(kind, model, args, ctx) for kind in ("DDP", "ZeRO-1", "FSDP")}
    if args.mp:
        runs["FSDP bf16"] = train("FSDP", model, args, ctx, mp=True)
    ddp = runs["DDP"]
    out = {"param_count": n_params,
           "param_max_abs": float(ddp["params"].abs().max()),
           "formula_fp32": zero_bytes(n_params, ctx.world, 4, 4, 8),
           "formula_mixed": zero_bytes(n_params, ctx.world, 2, 2, 12), "runs": {}}
    for kind, r in runs.items():
        diff = torch.tensor([float((r["params"] - ddp["params"]).abs().max())], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        held = [None] * ctx.world
        dist.all_gather_object(held, r["held"])
        out["runs"][kind] = {"losses": r["losses"], "param_diff_vs_ddp": float(diff.item()),
                             "loss_diff_vs_ddp": max(abs(a - b) for a, b in zip(r["losses"], ddp["losses"])),
                             "held_per_rank": held, "traffic": r["traffic"], "step_ms": statistics.median(r["step_ms"]),
                             "step_p20_ms": quantile(r["step_ms"], 0.2), "step_p80_ms": quantile(r["step_ms"], 0.8),
                             "step_samples_ms": r["step_ms"]}
        if "cuda_allocated" in r:
            out["runs"][kind].update(cuda_allocated=r["cuda_allocated"], cuda_peak=r["cuda_peak"])
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    launch.add_common(ap)
    ap.add_argument("--dim", type=int, default=16, help="model width d (each block d -> 4d -> d)")
    ap.add_argument("--blocks", type=int, default=3, help="MLP blocks, each sharded on its own")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3, help="Adam steps compared with DDP")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--mp", action="store_true", help="also run FSDP with bf16 parameters in compute (mixed precision)")
    ap.add_argument("--iters", type=int, default=3, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats (median reported)")
    args = ap.parse_args(argv)
    if min(args.dim, args.blocks, args.global_batch, args.steps, args.iters, args.repeats) < 1:
        ap.error("sizes, --steps, --iters and --repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return launch.run_main(PROG, parse_args, body, argv)


if __name__ == "__main__":
    from labkit.parallel.launch import exit_rank

    exit_rank(main())  # skips C++ static destructors that can abort a gloo worker at exit
