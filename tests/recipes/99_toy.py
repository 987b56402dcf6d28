# %% [markdown]
# # 99: how long does a copy take?
# A copy of n float32 values reads and writes each once: 8n bytes. Predict its time, then measure.

# %% tags=["parameters"]
device = None   # None: a GPU if there is one, else the CPU; or "cuda" / "cpu"
quick = None    # None: quick (small sizes) without a GPU, full size with one

# %%
import torch

import labkit

cfg = labkit.setup(device=device, quick=quick)
labkit.show_machine();

# %%
my_guess_ms = None  # your guess in ms

# %%
n = labkit.sized(full=2**26, quick=2**16)
x = torch.randn(n, device=cfg.device)
t = labkit.bench(lambda: x.clone(), warmup_ms=1, rep_ms=5)
labkit.guess(my_guess_ms, t.median_ms, "ms")
labkit.record("copy_ms", t.median_ms, "ms")
rate = labkit.gbps(8 * n, t.median_ms)
labkit.claim("copy_moves_bytes", "a copy moves its 8n bytes at a positive rate", holds=rate > 0,
             figures={"rate": (rate, "GB/s")}, because="every byte is read once and written once",
             otherwise=lambda: "the timer measured nothing: the copy was too small to time")
