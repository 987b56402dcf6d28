"""A toy torchrun lab (CONTRIBUTING, 'Add a torchrun lab'): every rank adds its rank + 1; rank 0 reports the sum.

Used by: tests/test_recipes.py.
"""
from __future__ import annotations

import argparse

import torch

from labkit.parallel import launch

PROG = "labkit.parallel.toy_allsum"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG)
    launch.add_common(ap)
    return ap.parse_args(argv)


def body(args: argparse.Namespace, ctx: launch.Ctx) -> dict:
    import torch.distributed as dist

    t = torch.tensor([ctx.rank + 1.0], device=ctx.device)
    dist.all_reduce(t)
    launch.sync(ctx.device)
    return {"sum": float(t.item())}


def main(argv: list[str] | None = None) -> int:
    return launch.run_main(PROG, parse_args, body, argv)


if __name__ == "__main__":
    launch.exit_rank(main())
