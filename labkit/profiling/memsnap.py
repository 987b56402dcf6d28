"""Reading a CUDA memory snapshot (`labkit.compat.memory_snapshot()`): live blocks and where the code
allocated them, the bytes they add up to, and the allocator's trace (allocations, frees, an OOM).

Used by: notebook 11.
"""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path
from typing import Any

import torch

# A tensor holds an active_allocated block; an active_awaiting_free one was freed by Python but another stream's
# queued work may still use it (record_stream): torch.cuda.memory_allocated no longer counts it.
LIVE = ("active_allocated", "active_awaiting_free")
_INTERNAL = tuple(str(p) + os.sep for p in (Path(torch.__file__).parent, Path(__file__).parent.parent,
                                            Path(sysconfig.get_paths()["purelib"]))) + ("<frozen",)


def where(frames: list[dict[str, Any]]) -> str:
    """The innermost frame of the user's own code in a recorded stack ('file:line in name'), or a note why none."""
    for f in frames:
        if not f.get("filename", "").startswith(_INTERNAL):
            return f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} in {f['name']}"
    return f"{frames[0]['filename'].rsplit('/', 1)[-1]}:{frames[0]['line']}" if frames else "(before recording)"


def live_blocks(snapshot: dict[str, Any], device: int) -> list[dict[str, Any]]:
    """Blocks on `device` that tensors hold, largest first: size (bytes), state, and where they were allocated."""
    blocks = [{"size": b["size"], "state": b["state"], "where": where(b.get("frames", []))}
              for seg in snapshot.get("segments", []) if seg.get("device", device) == device
              for b in seg.get("blocks", []) if b["state"] in LIVE]
    return sorted(blocks, key=lambda b: -b["size"])


def live_bytes(snapshot: dict[str, Any], device: int) -> int:
    """Bytes of the blocks tensors hold on `device` (active_allocated): what torch.cuda.memory_allocated counts."""
    return sum(b["size"] for b in live_blocks(snapshot, device) if b["state"] == "active_allocated")


def trace(snapshot: dict[str, Any], device: int, action: str | None = None) -> list[dict[str, Any]]:
    """The allocator's recorded events on `device` (alloc, free_requested, segment_alloc, oom...), oldest first."""
    traces = snapshot.get("device_traces", [])
    events = traces[device] if device < len(traces) else []
    return [e for e in events if action is None or e["action"] == action]


def table(blocks: list[dict[str, Any]], rows: int = 6) -> str:
    """The largest blocks as text: MiB, state, where."""
    lines = [f"{'MiB':>10}  {'state':<20} allocated at"]
    lines += [f"{b['size'] / 2**20:>10.2f}  {b['state']:<20} {b['where']}" for b in blocks[:rows]]
    if len(blocks) > rows:
        lines.append(f"{sum(b['size'] for b in blocks[rows:]) / 2**20:>10.2f}  ({len(blocks) - rows} smaller blocks)")
    return "\n".join(lines)
