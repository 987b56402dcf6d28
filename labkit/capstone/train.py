"""One variant's training loop: the loss after N steps, ms per step (repeats), the host's time per step, peak memory.

A `Trainer` holds a model, an optimizer and a data source built the way its `Variant` says; each
`step()` trains on the next batch. Every variant sees the same batches in the same order from the
same initial weights, so the loss after N steps can only differ by what rounding does to training:
`calibrate` measures that on other seeds (fp32 against bf16, same seed), and more than it is a bug.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from labkit import compat
from labkit.capstone.data import Corpus, Windows, make_corpus
from labkit.capstone.model import GPT, GPTConfig
from labkit.capstone.variants import Variant
from labkit.precision import tf32 as tf32_mode
from labkit.stats import Samples
from labkit.timing import Timing, bench, sync


@dataclass(frozen=True)
class RunConfig:
    """The workload: model sizes, batch, the N steps of the loss check, and the timing budget."""

    model: GPTConfig
    batch: int = 8
    steps: int = 30
    windows: int = 64         # corpus size in windows of model.seq tokens (a multiple of batch)
    lr: float = 2e-3
    seed: int = 0
    time_steps: int = 5       # training steps per timed sample
    rep_ms: float = 200.0     # timing budget per variant (labkit.bench), after the N steps
    compile_backend: str = "inductor"  # "aot_eager" checks the traced graphs without generating code

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.model.seq


class LoopAdamW:
    """AdamW as a beginner writes it: a Python loop over the parameters, a few tensor ops each."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        for p, m, v in zip(self.params, self.m, self.v):
            g = p.grad
            p.mul_(1 - self.lr * self.wd)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            m_hat = m / (1 - b1 ** self.t)
            v_hat = v / (1 - b2 ** self.t)
            p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


class Trainer:
    """A model, optimizer and data source written as `variant` says; `step()` trains one batch."""

    def __init__(self, variant: Variant, run: RunConfig, corpus: Corpus, device: torch.device | str):
        self.v, self.run, self.device = variant, run, torch.device(device)
        if variant.needs and not (self.device.type == "cuda" and "CUDA" in variant.needs):
            raise RuntimeError(f"variant {variant.name!r} needs {variant.needs}; this run is on {self.device}")
        if corpus.seq != run.model.seq or corpus.windows % run.batch:
            raise ValueError(f"the corpus must have windows of {run.model.seq} tokens, a multiple of {run.batch} "
                             f"of them (make_corpus(windows, seq)); got {corpus.windows} of {corpus.seq}")
        cuda = self.device.type == "cuda"
        self.model = GPT(run.model, variant.attention, variant.pad, run.seed).to(self.device)
        params = list(self.model.parameters())
        if variant.optimizer == "loop":
            self.opt = LoopAdamW(params, lr=run.lr)
        elif variant.optimizer == "fused":
            self.opt = torch.optim.AdamW(params, lr=run.lr, fused=True)
        else:
            from labkit.kernels import TritonAdamW
            self.opt = TritonAdamW(params, lr=run.lr)
        self.forward = self.wrap(self.model)
        if variant.compile:
            self.forward = torch.compile(self.forward, mode=None if variant.compile == "default" else variant.compile,
                                         backend=run.compile_backend)
        self.autocast = (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)) if variant.bf16 \
            else contextlib.nullcontext
        self.logged: list[float] = []  # the baseline's loss.item() per step
        self.loss_buf = torch.zeros(run.steps, device=self.device)  # the others keep the loss on the device
        self.i = 0
        if variant.data == "device":
            self.tokens, self.windows = corpus.tokens.to(self.device), corpus.windows
            self.offsets = torch.arange(corpus.seq + 1, device=self.device)
            # the order: a DataLoader over the window indices, shuffled exactly as the baseline's loader
            self.order_loader = torch.utils.data.DataLoader(
                range(corpus.windows), batch_size=run.batch, shuffle=True, drop_last=True,
                generator=torch.Generator().manual_seed(run.seed))
            self.epoch, self.pos = torch.empty(0, dtype=torch.int64, device=self.device), 0
        else:
            pin = variant.data == "pinned" and cuda
            self.loader = torch.utils.data.DataLoader(
                Windows(corpus), batch_size=run.batch, shuffle=True, drop_last=True, pin_memory=pin,
                generator=torch.Generator().manual_seed(run.seed))
            self.it = iter(self.loader)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the step calls (DistributedDataParallel wraps the model here)."""
        return model

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.v.data == "device":
            if self.pos >= self.epoch.numel():
                self.epoch = torch.cat(list(self.order_loader)).to(self.device)  # once per epoch
                self.pos = 0
            rows = self.epoch[self.pos: self.pos + self.run.batch]
            self.pos += self.run.batch
            w = self.tokens[rows[:, None] * self.run.model.seq + self.offsets]
            return w[:, :-1], w[:, 1:]
        try:
            x, y = next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            x, y = next(self.it)
        nb = self.v.data == "pinned"
        return x.to(self.device, non_blocking=nb), y.to(self.device, non_blocking=nb)

    def step(self) -> None:
        """One training step on the next batch."""
        x, y = self.next_batch()
        with tf32_mode(self.v.tf32):
            if self.v.compile == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            with self.autocast():
                loss = self.forward(x, y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        if self.v.sync_each_step:
            self.logged.append(loss.item())  # for the log: the host waits here for the GPU to finish the step
        else:
            self.loss_buf[self.i % self.run.steps].copy_(loss.detach())
        self.i += 1

    def losses(self) -> list[float]:
        """The losses of the first N steps (one device-to-host copy for the variants that keep them there)."""
        if self.v.sync_each_step:
            return self.logged[: self.run.steps]
        return self.loss_buf.tolist()


# Fixed bounds for the unit tests' tiny runs (tests/test_capstone.py). Notebook 13 does not use them: it derives
# its tolerance from seeds (`calibrate`), because low precision does not only scatter the loss after N steps, it
# can shift it (on the GPUs we ran, bf16 ended 1.5-2% below fp32 in every run: a drift, not noise).
FP32_RTOL = 1e-3   # same arithmetic, different order or place: the loss after N steps agrees to this
LOW_RTOL = 1e-2    # TF32 and bf16 round matmul inputs to 10 and 7 mantissa bits (a tiny run moves far less)
# On a GPU the same code does not repeat bit for bit (atomic adds, e.g. in the embedding's backward, land in a
# different order each run) and N steps of training amplify the last bits.
GPU_RTOL = 3e-2


def tolerance(v: Variant, device: torch.device | str = "cpu") -> float:
    """A fixed relative tolerance of a variant's loss after N steps against the baseline's, on `device`
    (for the unit tests' tiny runs; notebook 13 derives its own from seeds with `calibrate`)."""
    if torch.device(device).type == "cuda":
        return GPU_RTOL
    return LOW_RTOL if (v.tf32 or v.bf16) else FP32_RTOL


def final_loss(losses: list[float]) -> float:
    """'The loss after N steps': the mean over the last tenth of the N steps (at least one)."""
    k = max(1, len(losses) // 10)
    return sum(losses[-k:]) / k


@dataclass
class Result:
    """One variant's measurements."""

    name: str
    loss: float
    losses: list[float]
    tokens_per_s: float
    tokens_per_s_p20: float
    tokens_per_s_p80: float
    peak_mem_gib: float | None
    warmup_s: float
    trainer: Trainer | None = field(default=None, repr=False)
    step_ms: Samples | None = None   # ms per training step: one sample per timed block of run.time_steps steps
    host_ms: Samples | None = None   # the host's time to issue one step, from an idle device (see host_issue_ms)
    tokens_per_step: int = 0

    @property
    def tokens_per_s_samples(self) -> Samples | None:
        """Tokens per second, one sample per timed block (from step_ms)."""
        tokens = self.tokens_per_step
        return self.step_ms.map(lambda ms: tokens * 1e3 / ms) if self.step_ms is not None else None


def host_issue_ms(step, device: torch.device, n: int) -> Samples:
    """The host's time to issue one step: step() timed from an idle device (synchronized) until it returns.
    On a GPU without a sync in the step this is the host's side alone (Python, dispatch, launches) while the
    device runs behind it; with a sync (.item()) or on the CPU it is the whole step."""
    out = []
    for _ in range(n):
        sync(device)
        t0 = time.perf_counter()
        step()
        out.append((time.perf_counter() - t0) * 1e3)
    sync(device)
    return Samples.of(out)


def paired_step_ms(first, second, device: torch.device | str, rounds: int = 10, steps: int = 2
                   ) -> tuple[Samples, Samples]:
    """ms per step of two step functions timed in alternating rounds of `steps` steps each (the order swapped
    every round): on a shared or drifting machine both see the same load, so their ratio is the loops', not
    the moment's."""
    device = torch.device(device)
    out: tuple[list[float], list[float]] = ([], [])
    for i in range(rounds):
        for j in ((0, 1) if i % 2 == 0 else (1, 0)):
            step = (first, second)[j]
            sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            sync(device)
            out[j].append((time.perf_counter() - t0) * 1e3 / steps)
    return Samples.of(out[0]), Samples.of(out[1])


def run_variant(variant: Variant, run: RunConfig, device: torch.device | str, corpus: Corpus | None = None,
                time_it: bool = True, keep: bool = False, trainer_cls: type = Trainer, min_reps: int = 10,
                host_reps: int = 10) -> Result:
    """Train N steps from the fixed start (the loss check), then time more steps with labkit.bench (at least
    `min_reps` samples of run.time_steps steps each) and the host's issue time of `host_reps` single steps."""
    device = torch.device(device)
    corpus = corpus or make_corpus(run.windows, run.model.seq, run.seed)
    if variant.compile:
        compat.reset_compiled()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    trainer = trainer_cls(variant, run, corpus, device)
    sync(device)
    t0 = time.perf_counter()
    trainer.step()  # the first step pays for compilation and autotuning
    sync(device)
    warmup_s = time.perf_counter() - t0
    for _ in range(run.steps - 1):
        trainer.step()
    losses = trainer.losses()
    med = p20 = p80 = float("nan")
    step_ms = host_ms = None
    if time_it:
        k = run.time_steps

        def some_steps() -> None:
            for _ in range(k):
                trainer.step()

        t: Timing = bench(some_steps, warmup_ms=min(50.0, run.rep_ms / 4), rep_ms=run.rep_ms, min_reps=min_reps,
                          flush_cache=False, device=device)
        per_s = k * run.tokens_per_step * 1e3
        med, p20, p80 = per_s / t.median_ms, per_s / t.p80_ms, per_s / t.p20_ms
        step_ms = t.map(lambda ms: ms / k)
        host_ms = host_issue_ms(trainer.step, device, host_reps)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return Result(variant.name, final_loss(losses), losses, med, p20, p80, peak, warmup_s,
                  trainer if keep else None, step_ms, host_ms, run.tokens_per_step)


@dataclass
class Calibration:
    """The loss after N steps on other seeds (new weights and batch order), in fp32 and in bf16 from the same
    start: how far honest training moves when only the rounding changes. `tolerance` is derived from it."""

    seeds: list[int]
    fp32: list[float]   # the fp32 reference's loss after N steps, per seed
    low: list[float]    # the bf16 variant's, same seeds

    MARGIN = 3.0  # a step's loss may sit this many times the largest calibration difference from the baseline's

    @property
    def diffs(self) -> list[float]:
        """(bf16 - fp32) / fp32 per seed: its sign and size tell a drift (the same sign on every seed) from noise."""
        return [(lo - f) / f for f, lo in zip(self.fp32, self.low)]

    @property
    def largest(self) -> float:
        return max(abs(d) for d in self.diffs)

    @property
    def seed_spread(self) -> float:
        """(max - min) / mean of the fp32 loss over the seeds: what a different start and order change."""
        return (max(self.fp32) - min(self.fp32)) / (sum(self.fp32) / len(self.fp32))

    def tolerance(self) -> float:
        """MARGIN x the largest relative difference rounding made on any calibration seed."""
        return self.MARGIN * self.largest


def calibrate(run: RunConfig, device: torch.device | str, corpus: Corpus, seeds: list[int],
              fp32: str = "device_data", low: str = "bf16") -> Calibration:
    """Train `fp32` and `low` (variant names) for N steps on each seed and keep their losses (no timing)."""
    from dataclasses import replace

    from labkit.capstone.variants import variant

    a, b = [], []
    for s in seeds:
        r = replace(run, seed=s)
        a.append(run_variant(variant(fp32), r, device, corpus, time_it=False).loss)
        b.append(run_variant(variant(low), r, device, corpus, time_it=False).loss)
    return Calibration(list(seeds), a, b)


@torch.no_grad()
def evaluate(model: torch.nn.Module, corpus: Corpus, device: torch.device | str, batch: int = 16) -> float:
    """Mean loss of `model` on every window of `corpus`, in fp32 and eager (the grader's own check)."""
    device = torch.device(device)
    was = model.training
    model.eval()
    model = getattr(model, "_orig_mod", model)
    total, n = 0.0, 0
    ds = Windows(corpus)
    for i in range(0, len(ds), batch):
        xs, ys = zip(*(ds[j] for j in range(i, min(i + batch, len(ds)))))
        x, y = torch.stack(xs).to(device), torch.stack(ys).to(device)
        total += float(model(x, y)) * len(xs)
        n += len(xs)
    model.train(was)
    return total / n


@torch.no_grad()
def output_distance(model: torch.nn.Module, reference: torch.nn.Module, corpus: Corpus,
                    device: torch.device | str) -> float:
    """Relative L2 distance of `model`'s logits from `reference`'s on every window of `corpus` (fp32, eager)."""
    x = torch.stack([Windows(corpus)[i][0] for i in range(corpus.windows)]).to(device)
    a, b = (getattr(m, "_orig_mod", m).eval()(x).float() for m in (model, reference))
    model.train(), reference.train()
    return float((a - b).norm() / b.norm())


def measure(make_trainer, run: RunConfig, device: torch.device | str, held_out: Corpus | None = None,
            reference: torch.nn.Module | None = None, keep: list | None = None):
    """What the grader measures of a training loop: `make_trainer(run, corpus, device)` returns an object
    with step() and losses() and a .model; N steps, the grader's own held-out loss (and the distance of the
    model's outputs from `reference`, the baseline's trained model), then tokens/s. `keep` gets the trainer."""
    from labkit.capstone.score import Measured

    device = torch.device(device)
    corpus = make_corpus(run.windows, run.model.seq, run.seed)
    held_out = held_out or make_corpus(max(run.batch, run.windows // 4), run.model.seq, run.seed + 1)
    trainer = make_trainer(run, corpus, device)
    sync(device)
    t0 = time.perf_counter()
    trainer.step()
    sync(device)
    warmup_s = time.perf_counter() - t0
    for _ in range(run.steps - 1):
        trainer.step()
    losses = tuple(float(x) for x in trainer.losses())
    eval_loss = evaluate(trainer.model, held_out, device)  # before timing: the weights after exactly N steps
    dist = output_distance(trainer.model, reference, held_out, device) if reference is not None else 0.0
    if keep is not None:
        import copy
        keep.append(copy.deepcopy(getattr(trainer.model, "_orig_mod", trainer.model)))

    def some_steps() -> None:
        for _ in range(run.time_steps):
            trainer.step()

    t = bench(some_steps, warmup_ms=min(50.0, run.rep_ms / 4), rep_ms=run.rep_ms, min_reps=3, flush_cache=False,
              device=device)
    return Measured(run.time_steps * run.tokens_per_step * 1e3 / t.median_ms, losses, eval_loss, warmup_s, dist)
