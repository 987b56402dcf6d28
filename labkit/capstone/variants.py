"""The steps from the beginner's loop to the fast one: each variant is its parent plus one change."""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Variant:
    """How one training loop is written. `parent` is the variant it changes; `removes` names the
    bottleneck the change removes, in one line (the notebook's claim checks it with the profiler)."""

    name: str
    label: str
    parent: str | None = None
    removes: str = ""
    data: str = "loader"          # loader (pageable, default DataLoader) | pinned (+ non_blocking) | device
    sync_each_step: bool = True   # loss.item() every step, for logging
    tf32: bool = False
    bf16: bool = False            # torch.autocast(dtype=bfloat16) around forward and loss
    optimizer: str = "loop"       # loop (Python loop over parameters) | fused (torch) | triton (labkit)
    attention: str = "naive"      # naive | sdpa | flash (labkit's Triton FlashAttention)
    compile: str = ""             # "" | "default" | "reduce-overhead" (CUDA graphs)
    pad: int = 1                  # round vocabulary and MLP hidden size up to a multiple of this
    ddp: bool = False             # DistributedDataParallel over every GPU (launched with torchrun)
    gives_up: str = ""            # what the change takes away from the parent besides what it removes ('' none)

    @property
    def needs(self) -> str:
        """What this variant needs that a CPU lacks ('' when it runs anywhere)."""
        if self.ddp:
            return "2 CUDA GPUs"
        if self.compile == "reduce-overhead":
            return "a CUDA GPU"
        return ""


_V: list[Variant] = [Variant("baseline", "baseline", removes="(the starting point)")]


def _then(name: str, label: str, removes: str, parent: str | None = None, **change) -> None:
    base = next(v for v in _V if v.name == (parent or _V[-1].name))
    _V.append(replace(base, name=name, label=label, parent=base.name, removes=removes, **change))


_then("pinned", "pinned, no sync", "the host waiting on the GPU each step (.item()) and pageable copies",
      data="pinned", sync_each_step=False)
_then("device_data", "data on device", "the DataLoader's per-step Python work and host-to-device copies",
      data="device")
_then("tf32", "TF32", "fp32 matmuls on CUDA cores instead of tensor cores", tf32=True)
_then("bf16", "bf16 autocast", "fp32 matmuls and fp32 activations (TF32 still reads 4-byte operands)", bf16=True)
_then("fused_adamw", "fused AdamW", "a dozen kernel launches per parameter in the Python-loop Adam",
      optimizer="fused")
_then("triton_adamw", "labkit AdamW", "the same launches, with labkit's one-kernel Triton AdamW",
      parent="bf16", optimizer="triton")
_then("sdpa", "SDPA", "the T x T scores and probabilities written to and read from memory",
      parent="fused_adamw", attention="sdpa")
_then("flash", "labkit Flash", "the same traffic, with labkit's Triton FlashAttention", parent="fused_adamw",
      attention="flash")
_then("compile", "compile", "one kernel per elementwise op (layer norm, GELU, residual adds, loss)",
      parent="sdpa", compile="default")
_then("reduce_overhead", "CUDA graphs", "the CPU launching every kernel of the step one by one",
      compile="reduce-overhead")
_then("padded", "padded shapes", "matmuls whose sizes are not multiples of the tensor-core tiles", pad=64)
_then("ddp", "DDP", "one GPU doing all the work (DistributedDataParallel over every GPU)", ddp=True,
      compile="default", gives_up="its parent's CUDA graphs: the DDP step is compiled in the default mode (capturing "
      "DDP's bucketed all-reduces in CUDA graphs is a step this course does not take), so its one-GPU yardstick is "
      "the same DDP step on one GPU, not its parent")

VARIANTS: dict[str, Variant] = {v.name: v for v in _V}


def variant(name: str) -> Variant:
    """A variant by name, or a ValueError listing them."""
    if name not in VARIANTS:
        raise ValueError(f"no variant {name!r}; pick one of {', '.join(VARIANTS)}")
    return VARIANTS[name]


def changes(v: Variant) -> dict[str, tuple]:
    """The settings `v` changes from its parent: field -> (parent's value, v's value); {} for the baseline."""
    if v.parent is None:
        return {}
    parent = variant(v.parent)
    skip = {"name", "label", "parent", "removes", "gives_up"}
    return {f: (getattr(parent, f), getattr(v, f)) for f in v.__dataclass_fields__
            if f not in skip and getattr(parent, f) != getattr(v, f)}


def chain(name: str) -> list[Variant]:
    """The variant and its ancestors, baseline first."""
    out = [variant(name)]
    while out[0].parent:
        out.insert(0, variant(out[0].parent))
    return out
