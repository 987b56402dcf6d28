"""Pipeline parallelism: a model cut into p stages, one process each, fed m micro-batches.

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m labkit.parallel.pipeline --out r.json

Stage s holds layers [s*L, (s+1)*L) and talks only to its neighbours: activations go forward to
s+1, gradients come back from it. Two schedules, each a per-stage *order* of forward (F) and
backward (B) steps on micro-batches: GPipe (all forwards, then all backwards) and 1F1B (a few
forwards, then one forward one backward, so at most p - s micro-batches are in flight on stage s).
With equal stage costs both idle for the same share of the time, the bubble (p-1)/(m+p-1).
Every step's start and end is recorded; `--stage-ms` pads each forward to that many ms (backward
to twice) with a sleep, so the costs are equal and controlled. Each timed run is followed by the
same schedule on a stage with no compute (the same tensors sent): what the pipeline's own transfers
and waits cost. Each stage also counts what one micro-batch keeps alive until its backward and,
on GPUs, the allocator's peak. The schedules as a model (no processes) live in labkit.parallel.schedule;
`naive_two_devices` is the one-process `.to()` split.

Used by: notebook 10, exercise 10.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from labkit.parallel import launch
from labkit.parallel.schedule import (ORDERS, bubble, bubble_formula, check_order, emulate, in_flight,
                                      order_1f1b, order_gpipe, replay, simulate)

PROG = "labkit.parallel.pipeline"
# the schedule model, re-exported: notebook 10 and exercise 10 call pipeline.simulate, pipeline.bubble, ...
__all__ = ["ORDERS", "PROG", "bubble", "bubble_formula", "check_order", "emulate", "in_flight", "order_1f1b",
           "order_gpipe", "replay", "simulate", "check", "sweep", "naive_two_devices", "main"]


# ---- the model and its stages -------------------------------------------------------------------
def make_model(p: int, layers: int, dim: int) -> nn.Sequential:
    """p * layers blocks Linear(dim, dim) + GELU; stage s is blocks [s*layers, (s+1)*layers)."""
    return nn.Sequential(*[nn.Sequential(nn.Linear(dim, dim), nn.GELU()) for _ in range(p * layers)])


def stage_of(model: nn.Sequential, s: int, layers: int) -> nn.Sequential:
    return nn.Sequential(*list(model)[s * layers:(s + 1) * layers])


def data(n: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 11)
    return torch.randn(n, dim, generator=g), torch.randn(n, dim, generator=g)


class _Held:
    """The bytes one micro-batch keeps alive on a stage until its backward: what autograd saves for backward
    (activations; not the parameters nor the input data, which exist anyway), the stage's input when it came
    from the previous stage, and its output; each storage counted once."""

    def __init__(self, skip: set[int]):
        self.skip, self.seen, self.bytes = skip, set(), 0

    def add(self, t: torch.Tensor) -> None:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.skip and ptr not in self.seen:
            self.seen.add(ptr)
            self.bytes += t.untyped_storage().nbytes()

    def pack(self, t: torch.Tensor):
        self.add(t)
        return t


class _Scale(nn.Module):
    """A stage with (almost) no compute: x times one parameter. The same schedule and the same transfers as a real
    stage, so a run of it measures what the pipeline costs besides compute (sends, receives, synchronisation)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return x * self.w


def _exchange(send: torch.Tensor, recv: torch.Tensor, peer: int) -> None:
    """Send `send` to `peer` and receive `recv` from it, in rank order: the lower rank sends first, the higher
    receives first, so the two never both wait in a send (on NCCL a large send waits until its receive is posted)."""
    import torch.distributed as dist

    ops = [(dist.isend, send), (dist.irecv, recv)]
    for w in [op(t, peer) for op, t in (ops if dist.get_rank() < peer else ops[::-1])]:
        w.wait()


def run_schedule(schedule: str, stage: nn.Module, ctx: launch.Ctx, xs: list[torch.Tensor], ys: list[torch.Tensor],
                 stage_ms: float, order=None) -> dict:
    """Run one training step's forward and backward passes on this stage; return its events, loss, memory."""
    import torch.distributed as dist

    s, p, m = ctx.rank, ctx.world, len(xs)
    steps = (order or ORDERS[schedule])(s, p, m)
    check_order(steps, m)
    last, dev = s == p - 1, ctx.device
    shape, dtype = xs[0].shape, xs[0].dtype
    skip = {t.untyped_storage().data_ptr() for t in [*stage.parameters(), *xs, *ys]}   # there anyway
    inputs, outputs, held, events, works, losses = {}, {}, {}, [], [], []
    pending = None   # (tensor, peer): the last step's send, joined with the next receive from the same peer
    live = peak = 0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
    dist.barrier()
    launch.sync(dev)
    # perf_counter is CLOCK_MONOTONIC on Linux, one clock for every process of a host: the earliest
    # rank's start is the common origin (processes on several hosts would need their offsets measured)
    origin = torch.tensor([time.perf_counter()], dtype=torch.float64, device=dev)
    dist.all_reduce(origin, op=dist.ReduceOp.MIN)
    origin = float(origin.item())
    for op, i in steps:
        peer = (s - 1 if s > 0 else None) if op == "F" else (s + 1 if not last else None)
        buf = torch.empty(shape, dtype=dtype, device=dev) if peer is not None else None
        # plain isend/irecv, one communicator per pair of stages on NCCL (batch_isend_irecv hung on 2 H200s)
        if pending is not None and pending[1] == peer:   # an exchange with one peer, in rank order
            _exchange(pending[0], buf, peer)
        else:
            if pending is not None:
                works.append((dist.isend(*pending), pending[0]))   # keep the tensor until sent
            if buf is not None:
                dist.irecv(buf, peer).wait()
        pending = None
        launch.sync(dev)
        t0 = time.perf_counter()
        if op == "F":
            inp = xs[i] if s == 0 else buf.requires_grad_()
            kept = _Held(skip)
            with torch.autograd.graph.saved_tensors_hooks(kept.pack, lambda t: t):
                out = stage(inp)
                if last:
                    out = F.mse_loss(out, ys[i]) / m   # the mean over micro-batches = the whole batch's loss
                    losses.append(float(out.detach()) * m)
            kept.add(inp)
            kept.add(out)
            inputs[i], outputs[i], held[i] = inp, out, kept.bytes
            live += held[i]
            peak = max(peak, live)
            if not last:
                pending = (out.detach(), s + 1)
        else:
            outputs[i].backward(None if last else buf)
            if s > 0:
                pending = (inputs[i].grad, s - 1)
            live -= held[i]
            del inputs[i], outputs[i]
        launch.sync(dev)
        pad = (stage_ms if op == "F" else 2 * stage_ms) / 1e3 - (time.perf_counter() - t0)
        if pad > 0:
            time.sleep(pad)
        events.append({"stage": s, "op": op, "mb": i, "start": t0 - origin, "end": time.perf_counter() - origin})
        works = [(w, t) for w, t in works if not w.is_completed()]   # a sent tensor is freed once its send is done
    if pending is not None:
        works.append((dist.isend(*pending), pending[0]))
    for w, _ in works:
        w.wait()
    out = {"events": events, "losses": losses, "peak_saved_bytes": peak, "per_mb_bytes": max(held.values()),
           "in_flight": in_flight(steps)}
    if dev.type == "cuda":
        out["peak_cuda_bytes"] = torch.cuda.max_memory_allocated(dev) - base
    return out


def check(args, ctx: launch.Ctx) -> dict:
    """Each schedule's loss and this stage's gradients against one process on the whole batch."""
    import torch.distributed as dist

    torch.manual_seed(args.seed)
    model = make_model(ctx.world, args.layers, args.check_dim).to(ctx.device)
    x, y = data(args.check_m * 4, args.check_dim, args.seed)   # micro-batches of 4 rows
    x, y = x.to(ctx.device), y.to(ctx.device)
    loss = F.mse_loss(model(x), y)   # the reference: every rank computes it (a small model)
    loss.backward()
    ref_loss = float(loss.detach())
    ref = [q.grad.detach().clone() for q in stage_of(model, ctx.rank, args.layers).parameters()]
    scale = torch.tensor([max(float(g.abs().max()) for g in ref)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(scale, op=dist.ReduceOp.MIN)   # the smallest stage's gradients: deep stacks shrink them
    out = {"ref_loss": ref_loss, "grad_max_abs": float(scale.item())}
    mine = max(float(g.abs().max()) for g in ref)
    for schedule in args.schedules:
        stage = copy.deepcopy(stage_of(model, ctx.rank, args.layers)).to(ctx.device)
        stage.zero_grad(set_to_none=True)
        xs, ys = list(x.chunk(args.check_m)), list(y.chunk(args.check_m))
        r = run_schedule(schedule, stage, ctx, xs, ys, 0.0)
        err = max(float((q.grad - g).abs().max()) for q, g in zip(stage.parameters(), ref))
        # absolute, relative to this stage's
        diff = torch.tensor([err, err / mine], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        loss = torch.tensor([sum(r["losses"]) / args.check_m if r["losses"] else 0.0], dtype=torch.float64,
                            device=ctx.device)
        dist.broadcast(loss, src=ctx.world - 1)
        out[schedule] = {"grad_diff": float(diff[0]), "grad_rel_diff": float(diff[1]), "loss": float(loss.item()),
                         "loss_diff": abs(float(loss.item()) - ref_loss)}
    return out


def sweep(args, ctx: launch.Ctx) -> list[dict]:
    """For each schedule and m: the median measured bubble over repeats, the events of that run, memory per stage."""
    import torch.distributed as dist

    torch.manual_seed(args.seed)
    stage = stage_of(make_model(ctx.world, args.layers, args.dim), ctx.rank, args.layers).to(ctx.device)
    idle = _Scale().to(ctx.device)
    rows = []
    for schedule in args.schedules:
        for m in args.ms:
            x, y = data(m * args.micro_batch, args.dim, args.seed)
            xs, ys = [c.to(ctx.device) for c in x.chunk(m)], [c.to(ctx.device) for c in y.chunk(m)]
            runs, overhead = [], []
            for rep in range(args.warmup + args.repeats):
                stage.zero_grad(set_to_none=True)
                mine = run_schedule(schedule, stage, ctx, xs, ys, args.stage_ms)
                every = [None] * ctx.world
                dist.all_gather_object(every, mine)
                # the same schedule and transfers with no compute: what the pipeline itself costs at this m
                bare = [None] * ctx.world
                dist.all_gather_object(bare, run_schedule(schedule, idle, ctx, xs, ys, 0.0)["events"])
                if rep >= args.warmup:
                    events = [e for r in every for e in r["events"]]
                    runs.append((bubble(events)["mean"], events, every))
                    overhead.append(bubble([e for r in bare for e in r])["makespan"])
            runs.sort(key=lambda r: r[0])
            med, events, every = runs[len(runs) // 2]
            busy = [sum(e["end"] - e["start"] for e in events if e["stage"] == st) for st in range(ctx.world)]
            row = {"schedule": schedule, "p": ctx.world, "m": m, "bubble": med, "bubbles": [r[0] for r in runs],
                   "formula": bubble_formula(ctx.world, m), "events": events,
                   "makespan_s": bubble(events)["makespan"], "per_stage_bubble": bubble(events)["per_stage"],
                   "busy_per_mb_s": statistics.fmean(busy) / m, "busy_mean_s": statistics.fmean(busy),
                   "replay_makespan_s": bubble(replay(events, ctx.world, m, schedule))["makespan"],
                   "overhead_makespans_s": overhead,
                   "peak_saved_bytes": [r["peak_saved_bytes"] for r in every],
                   "per_mb_bytes": [r["per_mb_bytes"] for r in every], "in_flight": [r["in_flight"] for r in every]}
            if "peak_cuda_bytes" in every[0]:
                row["peak_cuda_bytes"] = [r["peak_cuda_bytes"] for r in every]
            rows.append(row)
    return rows


def naive_two_devices(devices: tuple[str, str], dim: int = 256, layers: int = 2, batch: int = 64,
                      steps: int = 3) -> dict:
    """One process, first half of the model on devices[0], second on devices[1] via .to(): who works when.

    Each step is forward A, forward B, backward B, backward A, one after another: while one device
    computes, the other waits for it, so each is busy about half the time at best. The events (for a
    timeline) are timed with a synchronisation between the parts, so they cannot overlap by construction;
    on two GPUs, `unsynced` also times the step as a program runs it, each half on its own GPU.
    """
    torch.manual_seed(0)
    model = make_model(2, layers, dim)
    a, b = stage_of(model, 0, layers).to(devices[0]), stage_of(model, 1, layers).to(devices[1])
    x, y = data(batch, dim, 0)
    x, y = x.to(devices[0]), y.to(devices[1])
    events = []

    def timed(dev: str, name: str, fn):
        launch.sync(torch.device(dev))
        t0 = time.perf_counter()
        r = fn()
        launch.sync(torch.device(dev))
        events.append({"stage": 0 if name.endswith("A") else 1, "op": name[0], "mb": 0,
                       "start": t0, "end": time.perf_counter()})
        return r

    best = None
    for _ in range(steps):   # keep the fastest step (the least disturbed by other work on the host)
        events.clear()
        h = timed(devices[0], "F A", lambda: a(x))
        hb = h.detach().to(devices[1]).requires_grad_()   # the copy between devices is the only link
        loss = timed(devices[1], "F B", lambda hb=hb: F.mse_loss(b(hb), y))
        timed(devices[1], "B B", loss.backward)
        timed(devices[0], "B A", lambda h=h, hb=hb: h.backward(hb.grad.to(devices[0])))
        t0 = events[0]["start"]
        step = [{**e, "start": e["start"] - t0, "end": e["end"] - t0} for e in events]
        if best is None or step[-1]["end"] < best[-1]["end"]:
            best = step
    out = {"devices": list(devices), "events": best, **bubble(best)}
    if all(d.startswith("cuda") for d in devices) and torch.device(devices[0]) != torch.device(devices[1]):
        out["unsynced"] = unsynced_steps(a, b, x, y, devices, steps)
    return out


def unsynced_steps(a: nn.Module, b: nn.Module, x: torch.Tensor, y: torch.Tensor, devices: tuple[str, str],
                   steps: int) -> dict:
    """The same training step as a program runs it, with no synchronisation between the halves: each half's work
    is timed by CUDA events on its own GPU, the whole step by the host clock (synchronised only before and after).
    If the GPUs could work at the same time, their busy times would add up to more than the step."""
    d0, d1 = torch.device(devices[0]), torch.device(devices[1])

    def pair(dev):
        with torch.cuda.device(dev):
            return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def mark(ev, dev):
        with torch.cuda.device(dev):
            ev.record()

    walls, busy = [], [[], []]
    for _ in range(max(steps, 10) + 1):   # the first one warms up
        fa, fb, ba = pair(d0), pair(d1), pair(d0)
        for dev in (d0, d1):
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        mark(fa[0], d0)
        h = a(x)
        mark(fa[1], d0)
        hb = h.detach().to(d1).requires_grad_()
        mark(fb[0], d1)
        F.mse_loss(b(hb), y).backward()
        mark(fb[1], d1)
        g = hb.grad.to(d0)
        mark(ba[0], d0)
        h.backward(g)
        mark(ba[1], d0)
        for dev in (d0, d1):
            torch.cuda.synchronize(dev)
        walls.append(time.perf_counter() - t0)
        busy[0].append((fa[0].elapsed_time(fa[1]) + ba[0].elapsed_time(ba[1])) / 1e3)
        busy[1].append(fb[0].elapsed_time(fb[1]) / 1e3)
    return {"step_s": walls[1:], "busy_s": [busy[0][1:], busy[1][1:]]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    launch.add_common(ap)
    ap.add_argument("--dim", type=int, default=64, help="width of every layer and of the activations sent")
    ap.add_argument("--layers", type=int, default=2, help="Linear+GELU blocks per stage")
    ap.add_argument("--micro-batch", type=int, default=8, help="rows per micro-batch")
    ap.add_argument("--ms", type=str, default="1,2,4,8", help="comma-separated micro-batch counts m to sweep")
    ap.add_argument("--schedules", type=str, default="gpipe,1f1b", help="comma-separated: gpipe, 1f1b")
    ap.add_argument("--stage-ms", type=float, default=5.0,
                    help="pad each forward to this many ms (backward to 2x); 0: compute only")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per (schedule, m); the median is reported")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per (schedule, m) first")
    ap.add_argument("--check-m", type=int, default=4, help="micro-batches in the correctness check")
    ap.add_argument("--check-dim", type=int, default=32, help="layer width in the correctness check (a small model)")
    args = ap.parse_args(argv)
    try:
        args.ms = [int(v) for v in args.ms.split(",") if v]
        args.schedules = [v for v in args.schedules.split(",") if v]
    except ValueError:
        ap.error("--ms takes comma-separated integers, e.g. 1,2,4,8")
    if bad := [v for v in args.schedules if v not in ORDERS]:
        ap.error(f"unknown schedule(s) {bad}: use gpipe and/or 1f1b")
    if not args.ms or min(args.ms) < 1 or min(args.dim, args.layers, args.micro_batch, args.repeats, args.check_m,
                                              args.check_dim) < 1:
        ap.error("--ms, --dim, --layers, --micro-batch, --repeats, --check-m and --check-dim must be at least 1")
    if args.stage_ms < 0:
        ap.error("--stage-ms must be >= 0")
    return args


def body(args, ctx: launch.Ctx) -> dict:
    if ctx.world < 2:
        sys.exit(f"{PROG}: a pipeline needs at least 2 stages (processes); use --nproc_per_node 2 or more")
    return {"check": check(args, ctx), "sweep": sweep(args, ctx)}


def main(argv: list[str] | None = None) -> int:
    return launch.run_main(PROG, parse_args, body, argv)


if __name__ == "__main__":
    from labkit.parallel.launch import exit_rank

    exit_rank(main())  # skips C++ static destructors that can abort a gloo worker at exit
