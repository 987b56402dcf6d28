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
labkit.show_machine()

# %%
my_guess_ms = None  # your guess in ms

# %%
n = labkit.sized(full=2**26, quick=2**20)
x, x4 = torch.randn(n, device=cfg.device), torch.randn(4 * n, device=cfg.device)
t = labkit.bench(lambda: x.clone(), warmup_ms=1, rep_ms=20)
t4 = labkit.bench(lambda: x4.clone(), warmup_ms=1, rep_ms=20)
labkit.guess(my_guess_ms, t.median_ms, "ms")
labkit.record("copy_ms", t.median_ms, "ms")
labkit.claim("copy_time_grows_with_bytes", "copying 4x the bytes takes at least 2x as long",
             lambda f: f["4n"] >= 2 * f["n"], figures={"n": (t, "ms"), "4n": (t4, "ms")},
             because="every byte is read once and written once: a copy this large is bound by bandwidth")
