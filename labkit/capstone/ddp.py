"""The last step: DistributedDataParallel over every GPU, each rank training on its share of each batch.

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m labkit.capstone.ddp --out r.json \\
        --workload '{"batch": 32, ...}' --variant ddp

Each rank takes an equal slice of the global batch, so the averaged gradient, and the loss after N
steps, are the single-process run's (strong scaling). Timing: fixed step counts, a synchronize and the
slowest rank's clock (labkit.bench would pick a different repetition count on each rank and deadlock);
the helpers come from labkit.parallel.ddp (notebook 08).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from labkit.capstone.data import make_corpus
from labkit.capstone.model import GPTConfig
from labkit.capstone.train import RunConfig, Trainer, final_loss
from labkit.capstone.variants import variant
from labkit.parallel.launch import choose, init_group, slowest, timed_on_slowest_rank
from labkit.timing import sync
from labkit.parallel.launch import torchrun


class DDPTrainer(Trainer):
    """A Trainer whose model is wrapped in DDP and whose batches are this rank's slice."""

    def __init__(self, *args, rank: int, world: int, **kw):
        self.rank, self.world = rank, world
        super().__init__(*args, **kw)

    def wrap(self, model):
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def next_batch(self):
        x, y = super().next_batch()
        part = slice(self.rank * self.run.batch // self.world, (self.rank + 1) * self.run.batch // self.world)
        return x[part], y[part]


def run_config(d: dict) -> RunConfig:
    return RunConfig(**{**d, "model": GPTConfig(**d["model"])})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labkit.capstone.ddp", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workload", required=True, help="the RunConfig as JSON (labkit.capstone.ddp.launch writes it)")
    ap.add_argument("--variant", default="ddp")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    if "RANK" not in os.environ:
        print("labkit.capstone.ddp: run me with torch.distributed.run (see the module docstring)", file=sys.stderr)
        return 2
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", 0))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend, dev_type = choose(args.backend, args.device, int(os.environ.get("LOCAL_WORLD_SIZE", world)), gpus)
    run = run_config(json.loads(args.workload))
    v = variant(args.variant)
    if run.batch % world:
        print(f"labkit.capstone.ddp: batch {run.batch} does not split over {world} ranks", file=sys.stderr)
        return 2
    if dev_type != "cuda":
        v = replace(v, compile="", ddp=False)  # the CPU check: eager, gloo
    device = init_group(backend, dev_type, local, (os.cpu_count() or 1) // world)
    try:
        corpus = make_corpus(run.windows, run.model.seq, run.seed)
        t = DDPTrainer(v, run, corpus, device, rank=rank, world=world)
        sync(device)
        t0 = time.perf_counter()
        t.step()
        sync(device)
        warmup = slowest(time.perf_counter() - t0, device)
        for _ in range(run.steps - 1):
            t.step()
        buf = t.loss_buf.clone() if not v.sync_each_step else torch.tensor(t.logged, device=device)
        dist.all_reduce(buf)  # each rank's loss is the mean over its slice: equal slices, so average them
        losses = (buf / world).tolist()
        times = [timed_on_slowest_rank(t.step, run.time_steps, device) for _ in range(args.repeats)]
        tps = sorted(run.time_steps * run.tokens_per_step / s for s in times)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if dev_type == "cuda" else None
        if rank == 0:
            out = {"world": world, "backend": backend, "device": dev_type, "losses": losses,
                   "loss": final_loss(losses), "tokens_per_s": statistics.median(tps),
                   "tokens_per_s_p20": tps[int(0.2 * (len(tps) - 1))],
                   "tokens_per_s_p80": tps[int(0.8 * (len(tps) - 1))], "tokens_per_s_samples": tps,
                   "peak_mem_gib": peak, "warmup_s": warmup}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1))
    finally:
        dist.destroy_process_group()
    return 0


def launch(run: RunConfig, nproc: int, out: Path, device: str = "auto", name: str = "ddp",
           timeout: int = 600, repeats: int = 7) -> dict:
    """Run the DDP variant on `nproc` processes with torch.distributed.run; return rank 0's results
    (tokens_per_s_samples: one per timed repeat of run.time_steps steps)."""
    return torchrun("labkit.capstone.ddp", nproc, ["--workload", json.dumps(asdict(run)), "--variant", name,
                                                   "--repeats", str(repeats)],
                    device=device, out=out, timeout=timeout, echo=False)


if __name__ == "__main__":
    from labkit.parallel.launch import exit_rank

    exit_rank(main())  # skips C++ static destructors that can abort a gloo worker at exit
