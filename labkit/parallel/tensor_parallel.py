"""Tensor parallelism: one MLP block's weights split over t processes, one all-reduce per block each way.

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m labkit.parallel.tensor_parallel --out r.json

The block is up = Linear(d, h), GELU, down = Linear(h, d). Column-parallel `up`: rank r keeps rows
[r h/t, (r+1) h/t) of its weight, so it computes its own slice of the hidden units from the whole
input, and GELU (elementwise) needs no talk. Row-parallel `down`: rank r keeps the matching
columns, so its product is a partial sum of the output; one all-reduce adds the t partial sums.
Backward mirrors it: the input's gradient is a sum over ranks, one all-reduce. The same block is
built by hand and with torch.distributed.tensor.parallel (ColwiseParallel, RowwiseParallel);
both are checked against one process and their collectives counted.

Used by: notebook 10.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit.parallel.launch import timed_on_slowest_rank
from labkit.stats import quantile
from labkit.parallel import launch

PROG = "labkit.parallel.tensor_parallel"
COMM = {"all_reduce_calls": 0, "all_reduce_bytes": 0}   # what the hand-built layers sent


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    COMM["all_reduce_calls"] += 1
    COMM["all_reduce_bytes"] += t.numel() * t.element_size()
    dist.all_reduce(t)
    return t


class CopyToRanks(torch.autograd.Function):
    """Forward: the input as is (every rank has it). Backward: sum the gradient over ranks."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.contiguous().clone())


class SumOverRanks(torch.autograd.Function):
    """Forward: all-reduce the partial sums. Backward: the gradient as is (the output is the same everywhere)."""

    @staticmethod
    def forward(ctx, x):
        return _all_reduce(x.contiguous().clone())

    @staticmethod
    def backward(ctx, grad):
        return grad


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def row_parallel_forward(x_local: torch.Tensor, weight_local: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x_local (.., h/t) @ weight_local.T (d, h/t): this rank's partial sum; all-reduce it, add the bias once."""
    out = SumOverRanks.apply(F.linear(x_local, weight_local))
    return out + bias if bias is not None else out


class ColumnParallelLinear(nn.Module):
    """This rank's rows of a Linear's weight (and bias): its slice of the output features."""

    def __init__(self, full: nn.Linear, rank: int, world: int):
        super().__init__()
        rows = full.out_features // world
        self.weight = nn.Parameter(full.weight.detach()[rank * rows:(rank + 1) * rows].clone())
        self.bias = nn.Parameter(full.bias.detach()[rank * rows:(rank + 1) * rows].clone())

    def forward(self, x):
        return F.linear(CopyToRanks.apply(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's columns of a Linear's weight: a partial output, summed over ranks; the bias whole."""

    def __init__(self, full: nn.Linear, rank: int, world: int):
        super().__init__()
        cols = full.in_features // world
        self.weight = nn.Parameter(full.weight.detach()[:, rank * cols:(rank + 1) * cols].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x_local):
        return row_parallel_forward(x_local, self.weight, self.bias)


class TensorParallelMLP(nn.Module):
    """Column-parallel up, GELU on the local slice, row-parallel down: one all-reduce forward, one backward."""

    def __init__(self, mlp: MLP, rank: int, world: int):
        super().__init__()
        if mlp.up.out_features % world:
            raise ValueError(f"hidden size {mlp.up.out_features} does not split over {world} ranks: "
                             f"use a multiple of {world}")
        self.up, self.down = ColumnParallelLinear(mlp.up, rank, world), RowParallelLinear(mlp.down, rank, world)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def with_dtensor(mlp: MLP, device: torch.device, world: int) -> nn.Module:
    """The same split with PyTorch's ColwiseParallel / RowwiseParallel on a 1-D device mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(device.type, (world,))
    return parallelize_module(copy.deepcopy(mlp), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check(args, ctx: launch.Ctx) -> dict:
    """Outputs and gradients of both tensor-parallel blocks against one process; collectives counted."""
    from torch.distributed.tensor.debug import CommDebugMode

    r, t, dev = ctx.rank, ctx.world, ctx.device
    torch.manual_seed(args.seed)
    mlp = MLP(args.dim, args.hidden).to(dev)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.tokens, args.dim, generator=g).to(dev)
    y = torch.randn(args.tokens, args.dim, generator=g).to(dev)

    ref = copy.deepcopy(mlp)
    xr = x.clone().requires_grad_()
    ref_out = ref(xr)
    F.mse_loss(ref_out, y).backward()
    rows, cols = args.hidden // t, args.hidden // t
    ref_shards = {"up.weight": ref.up.weight.grad[r * rows:(r + 1) * rows],
                  "up.bias": ref.up.bias.grad[r * rows:(r + 1) * rows],
                  "down.weight": ref.down.weight.grad[:, r * cols:(r + 1) * cols], "down.bias": ref.down.bias.grad}
    out = {"out_max_abs": float(ref_out.abs().max()),
           "grad_max_abs": max(float(v.abs().max()) for v in ref_shards.values()),
           "x_grad_max_abs": float(xr.grad.abs().max())}

    hand = TensorParallelMLP(mlp, r, t)
    xh = x.clone().requires_grad_()
    COMM.update(all_reduce_calls=0, all_reduce_bytes=0)
    yh = hand(xh)
    fwd_calls, fwd_bytes = COMM["all_reduce_calls"], COMM["all_reduce_bytes"]
    F.mse_loss(yh, y).backward()
    out["hand"] = {"out_diff": float((yh - ref_out).abs().max()), "x_grad_diff": float((xh.grad - xr.grad).abs().max()),
                   "grad_diff": max(float((dict(hand.named_parameters())[k].grad - v).abs().max())
                                    for k, v in ref_shards.items()),
                   "forward_all_reduces": fwd_calls, "forward_bytes": fwd_bytes,
                   "backward_all_reduces": COMM["all_reduce_calls"] - fwd_calls,
                   "backward_bytes": COMM["all_reduce_bytes"] - fwd_bytes,
                   "local_params": sum(p.numel() for p in hand.parameters())}

    dt = with_dtensor(mlp, dev, t)
    xd = x.clone().requires_grad_()
    with CommDebugMode() as fwd_mode:
        yd = dt(xd)
    with CommDebugMode() as bwd_mode:
        F.mse_loss(yd, y).backward()
    full_grads = {k: _full(p.grad) for k, p in dt.named_parameters()}
    out["dtensor"] = {"out_diff": float((_full(yd) - ref_out).abs().max()),
                      "x_grad_diff": float((xd.grad - xr.grad).abs().max()),
                      "grad_diff": max(float((full_grads[k]
                                              - getattr(ref, k.split(".")[0]).get_parameter(k.split(".")[1]).grad)
                                             .abs().max())
                                       for k in full_grads),
                      "forward_comms": {str(k): v for k, v in fwd_mode.get_comm_counts().items()},
                      "backward_comms": {str(k): v for k, v in bwd_mode.get_comm_counts().items()},
                      "local_params": sum(p.to_local().numel() for p in dt.parameters())}
    worst = torch.tensor([out["hand"]["out_diff"], out["hand"]["grad_diff"], out["dtensor"]["out_diff"],
                          out["dtensor"]["grad_diff"]], dtype=torch.float64, device=dev)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    out["worst_over_ranks"] = dict(zip(["hand_out", "hand_grad", "dtensor_out", "dtensor_grad"], worst.tolist()))
    out["full_params"] = sum(p.numel() for p in mlp.parameters())
    return out


def _timed(fn, iters: int, repeats: int, device: torch.device) -> list[float]:
    """Seconds per call of fn over `iters` calls, `repeats` times, the slowest rank's each time (sorted): samples."""
    fn()
    return sorted(timed_on_slowest_rank(fn, iters, device) / iters for _ in range(repeats))


def _interleaved(fns, iters: int, repeats: int, device: torch.device) -> list[list[float]]:
    """Like `_timed` for several functions that take turns, repeat by repeat, so that a change in the machine's
    load reaches all of them: one list of samples (seconds per call, sorted) per function."""
    for fn in fns:
        fn()
    out = [[] for _ in fns]
    for _ in range(repeats):
        for fn, xs in zip(fns, out):
            xs.append(timed_on_slowest_rank(fn, iters, device) / iters)
    return [sorted(xs) for xs in out]


def sweep(args, ctx: launch.Ctx) -> list[dict]:
    """Per width d (hidden 4d): the tensor-parallel step, its two all-reduces alone, one process's step."""
    rows = []
    for dim in args.dims:
        torch.manual_seed(args.seed)
        mlp = MLP(dim, 4 * dim).to(ctx.device)
        hand = TensorParallelMLP(mlp, ctx.rank, ctx.world)
        x = torch.randn(args.tokens, dim, device=ctx.device)
        buf = torch.randn(args.tokens, dim, device=ctx.device)

        def tp_step(hand=hand, x=x):
            hand(x.requires_grad_()).sum().backward()

        def full_step(mlp=mlp, x=x):
            mlp(x).sum().backward()

        # the one-process step runs on every rank at once, like the TP step
        tp, ar, full = _interleaved([tp_step, lambda buf=buf: dist.all_reduce(buf), full_step],
                                    args.iters, args.repeats,
                                    ctx.device)
        med = statistics.median
        nbytes = args.tokens * dim * 4
        rows.append({"dim": dim, "hidden": 4 * dim, "tokens": args.tokens, "tp_step_ms": med(tp) * 1e3,
                     "tp_p20_ms": quantile(tp, 0.2) * 1e3, "tp_p80_ms": quantile(tp, 0.8) * 1e3,
                     "all_reduce_ms": med(ar) * 1e3,
                     "comm_ms": 2 * med(ar) * 1e3, "full_step_ms": med(full) * 1e3,
                     "comm_fraction": min(1.0, 2 * med(ar) / med(tp)), "all_reduce_bytes": nbytes,
                     "tp_samples_ms": [t * 1e3 for t in tp], "all_reduce_samples_ms": [t * 1e3 for t in ar],
                     "full_samples_ms": [t * 1e3 for t in full],
                     "bytes_per_step": 2 * nbytes, "ring_bytes_per_rank": 2 * nbytes * 2 * (ctx.world - 1) / ctx.world,
                     "flops_per_step": 3 * 2 * 2 * args.tokens * dim * 4 * dim})
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    launch.add_common(ap)
    ap.add_argument("--dim", type=int, default=16, help="model width d of the correctness check")
    ap.add_argument("--hidden", type=int, default=64,
                    help="hidden width of the correctness check (a multiple of the ranks)")
    ap.add_argument("--tokens", type=int, default=32, help="rows (batch x sequence) per step")
    ap.add_argument("--dims", type=str, default="", help="comma-separated widths d to time ('' skips the sweep)")
    ap.add_argument("--iters", type=int, default=10, help="timed calls per repeat")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats (median reported)")
    args = ap.parse_args(argv)
    try:
        args.dims = [int(v) for v in args.dims.split(",") if v]
    except ValueError:
        ap.error("--dims takes comma-separated integers, e.g. 256,512,1024")
    if min([args.dim, args.hidden, args.tokens, args.iters, args.repeats] + args.dims) < 1:
        ap.error("sizes, --iters and --repeats must be at least 1")
    return args


def body(args, ctx: launch.Ctx) -> dict:
    if args.hidden % ctx.world or any((4 * d) % ctx.world for d in args.dims):
        sys.exit(f"{PROG}: hidden sizes must split evenly over {ctx.world} ranks: use multiples of {ctx.world}")
    return {"check": check(args, ctx), "sweep": sweep(args, ctx)}


def main(argv: list[str] | None = None) -> int:
    return launch.run_main(PROG, parse_args, body, argv)


if __name__ == "__main__":
    from labkit.parallel.launch import exit_rank

    exit_rank(main())  # skips C++ static destructors that can abort a gloo worker at exit
