"""The instructor's hidden cases (solutions/graded/NN_topic.py) joined to the public exercise modules."""
from __future__ import annotations

import types
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from labkit import exercises
from labkit.exercises.spec import Function

DEFAULT_SEED = 20250601
GRADED_KEYS = {"points", "cases"}


@dataclass
class FnSpec:
    """One graded function: its notebook, points and hidden cases, and its public spec."""

    notebook: str
    name: str
    points: float
    make_cases: Callable
    fn: Function
    cases: list[dict] = field(default_factory=list)


def _load(path: Path) -> types.ModuleType:
    """Run a graded file as a module (no bytecode left behind next to it)."""
    module = types.ModuleType(f"labkit_graded_{path.stem}")
    module.__file__ = str(path)
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
    return module


def load_specs(graded_dir: Path) -> dict[str, list[FnSpec]]:
    """notebook name -> its graded functions, from graded_dir/NN_topic.py and labkit.exercises."""
    public = exercises.by_notebook()
    specs: dict[str, list[FnSpec]] = {}
    for path in sorted(graded_dir.glob("[0-9]*.py")):
        graded = getattr(_load(path), "EXERCISES", None)
        if not isinstance(graded, dict) or not graded:
            raise ValueError(f"{path} defines no EXERCISES dict")
        if path.stem not in public:
            raise ValueError(f"{path}: no exercise module for notebook {path.stem!r} is registered in "
                             f"labkit/exercises/__init__.py (EXERCISES)")
        fns = {f.name: f for f in public[path.stem]}
        specs[path.stem] = []
        for name, d in graded.items():
            if name not in fns:
                raise ValueError(f"{path}: {name!r} is not a function of {path.stem}'s exercise module "
                                 f"(it has {', '.join(fns)})")
            extra = set(d) - GRADED_KEYS
            if extra:
                raise ValueError(f"{path}: {name}: unknown keys {sorted(extra)}; a graded file gives only 'points' "
                                 f"and 'cases' (how the function runs lives in its labkit/exercises module)")
            specs[path.stem].append(FnSpec(path.stem, name, float(d.get("points", 1)), d["cases"], fns[name]))
    if not specs:
        raise ValueError(f"no graded tests (NN_topic.py files) in {graded_dir}")
    return specs


def default_seed(graded_dir: Path) -> int:
    path = graded_dir / "SEED"
    return int(path.read_text().split()[0]) if path.exists() else DEFAULT_SEED


def make_cases(spec: FnSpec, seed: int, gpu: bool) -> list[dict]:
    """The hidden cases of one function: the same for the same seed, a different draw per function."""
    import torch

    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(spec.name.encode())) % 2**62)
    return spec.make_cases(g, gpu)
