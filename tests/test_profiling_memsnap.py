"""Reading memory snapshots: on a hand-built snapshot (any machine) and on a real one (a CUDA GPU)."""
from pathlib import Path

import pytest
import torch

from labkit import compat
from labkit.profiling import memsnap

TORCH_LINEAR = str(Path(torch.__file__).parent / "nn" / "modules" / "linear.py")
FRAMES = [{"filename": TORCH_LINEAR, "line": 125, "name": "forward"},
          {"filename": "/home/me/labkit/train.py", "line": 7, "name": "step"}]  # a user's folder may be named labkit
SNAP = {"segments": [
    {"device": 0, "blocks": [{"size": 2048, "state": "active_allocated", "frames": FRAMES},
                             {"size": 4096, "state": "inactive", "frames": []},
                             {"size": 512, "state": "active_awaiting_free", "frames": []}]},
    {"device": 1, "blocks": [{"size": 8192, "state": "active_allocated", "frames": []}]}],
    "device_traces": [[{"action": "alloc", "size": 2048, "frames": FRAMES},
                       {"action": "oom", "size": 1 << 30, "device_free": 10, "frames": FRAMES}], []]}


def test_live_blocks_are_the_held_ones_on_that_device_largest_first():
    blocks = memsnap.live_blocks(SNAP, 0)
    assert [b["size"] for b in blocks] == [2048, 512]  # the inactive (cached, free) block is not live
    assert blocks[0]["where"] == "train.py:7 in step"  # the user's frame, not torch's
    assert blocks[1]["where"] == "(before recording)"
    assert memsnap.live_bytes(SNAP, 0) == 2048 and memsnap.live_bytes(SNAP, 1) == 8192  # awaiting-free not counted


def test_trace_filters_by_action_and_device():
    assert [e["size"] for e in memsnap.trace(SNAP, 0, "oom")] == [1 << 30]
    assert len(memsnap.trace(SNAP, 0)) == 2 and memsnap.trace(SNAP, 1) == [] and memsnap.trace(SNAP, 5) == []
    assert "train.py:7" in memsnap.table(memsnap.live_blocks(SNAP, 0), rows=1)
    assert "1 smaller blocks" in memsnap.table(memsnap.live_blocks(SNAP, 0), rows=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real snapshot needs a CUDA GPU")
def test_a_real_snapshot_accounts_for_every_allocated_byte_and_records_an_oom():
    dev = torch.cuda.current_device()
    assert compat.record_memory_history(True)
    try:
        keep = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        snap = compat.memory_snapshot()
        assert memsnap.live_bytes(snap, dev) == torch.cuda.memory_allocated(dev)
        assert any(b["size"] >= keep.numel() and "test_profiling_memsnap" in b["where"]
                   for b in memsnap.live_blocks(snap, dev))
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
        ooms = memsnap.trace(compat.memory_snapshot(), dev, "oom")
        assert ooms and ooms[-1]["size"] >= 1 << 50
    finally:
        compat.record_memory_history(False)
