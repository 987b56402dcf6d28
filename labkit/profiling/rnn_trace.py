"""The small RNN the profiling notebook studies (an LSTM cell stepped in a Python loop), and the
recorder of its trimmed GPU trace that ships with the course.

Used by: notebook 11 (through labkit.profiling).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from labkit.profiling.chrome_trace import load_trace, trim


def rnn_loop(cell, x, h, c):
    """Step an LSTM cell over x (seq, batch, features) in a Python loop: one cell call per step."""
    for t in range(x.shape[0]):
        h, c = cell(x[t], (h, c))
    return h


def make_rnn(hidden: int, batch: int, seq: int, device, features: int | None = None, seed: int = 0):
    """An nn.LSTMCell, an nn.LSTM with the same weights, an input and zero states, on `device`."""
    import torch

    features = features or hidden
    g = torch.Generator().manual_seed(seed)
    cell = torch.nn.LSTMCell(features, hidden)
    lstm = torch.nn.LSTM(features, hidden)
    with torch.no_grad():
        for p in list(cell.parameters()) + list(lstm.parameters()):
            p.copy_(torch.rand(p.shape, generator=g) * 0.2 - 0.1)
        lstm.weight_ih_l0.copy_(cell.weight_ih)
        lstm.weight_hh_l0.copy_(cell.weight_hh)
        lstm.bias_ih_l0.copy_(cell.bias_ih)
        lstm.bias_hh_l0.copy_(cell.bias_hh)
    x = torch.randn(seq, batch, features, generator=g)
    h0 = torch.zeros(batch, hidden)
    return cell.to(device), lstm.to(device), x.to(device), h0.to(device), h0.clone().to(device)


def record_rnn_trace(out: Path, hidden: int = 64, seq: int = 32, batch: int = 1, device: str = "cuda") -> Path:
    """Profile the Python-loop LSTM cell (schedule wait=1, warmup=1, active=1) and save a trimmed trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from labkit.device import machine_info, setup

    setup(device=device)
    dev = torch.device(device)
    cell, _, x, h, c = make_rnn(hidden, batch, seq, dev)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    raw = Path(tempfile.mkdtemp()) / "raw.json"
    with torch.no_grad(), profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=1),
                                  on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        for _ in range(3):
            with record_function("rnn_loop"):
                rnn_loop(cell, x, h, c)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            prof.step()
    trace = load_trace(raw)
    info = machine_info()
    trace["labkit"] = {"what": f"nn.LSTMCell stepped in a Python loop: hidden {hidden}, batch {batch}, "
                               f"{seq} steps, no_grad", "GPU": info.get("GPU"), "torch": info["torch"],
                       "CUDA": info["CUDA (torch build)"], "driver": info.get("driver", ""),
                       "hidden": hidden, "seq": seq, "batch": batch}
    small = trim(trace, "rnn_loop")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(small, separators=(",", ":")))
    return out
