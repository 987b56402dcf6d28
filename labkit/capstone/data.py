"""The corpus: English-like sentences and sums, generated from a seed (no download), one token per character."""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

_SUBJECTS = ["the gpu", "a kernel", "the host", "each warp", "the model", "a student", "the compiler", "the cache",
             "every thread", "the optimizer", "the profiler", "a tensor"]
_VERBS = ["copies", "reads", "writes", "launches", "waits for", "fuses", "measures", "stores", "loads", "skips",
          "counts", "moves"]
_OBJECTS = ["bytes", "tiles", "rows", "gradients", "tokens", "weights", "kernels", "pages", "batches", "heads"]
_PLACES = ["to the device", "from the host", "in shared memory", "over the bus", "in registers", "on the stream",
           "before the sync", "after the step"]


def _sentence(rng: random.Random) -> str:
    if rng.random() < 0.25:  # a sum the model can learn to finish
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"{a} + {b} = {a + b}."
    s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.randint(2, 512)} {rng.choice(_OBJECTS)}"
    if rng.random() < 0.6:
        s += f" {rng.choice(_PLACES)}"
    return s[0].upper() + s[1:] + rng.choice([".", ".", "!", "?"])


def make_text(chars: int, seed: int = 0) -> str:
    """About `chars` characters of generated text (the same for a given seed on every machine)."""
    rng = random.Random(seed)
    parts, n = [], 0
    while n < chars:
        line = " ".join(_sentence(rng) for _ in range(rng.randint(1, 4))) + "\n"
        parts.append(line)
        n += len(line)
    return "".join(parts)[:chars]


@dataclass
class Corpus:
    """Token ids (int64, on the CPU) of the training text, the character table, and the window length."""

    tokens: torch.Tensor
    chars: str
    seq: int

    @property
    def vocab(self) -> int:
        return len(self.chars)

    @property
    def windows(self) -> int:
        """Non-overlapping training windows of seq + 1 tokens (input and shifted target)."""
        return (self.tokens.numel() - 1) // self.seq

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


@functools.cache
def _table_chars() -> frozenset[str]:
    """The characters of a long generated text: every character the generator makes (computed once)."""
    return frozenset(make_text(200_000, 12345))


def make_corpus(windows: int, seq: int, seed: int = 0) -> Corpus:
    """A corpus of exactly `windows` windows of `seq` tokens (plus one), character-level."""
    if windows < 1 or seq < 1:
        raise ValueError(f"make_corpus: windows and seq must be >= 1, got {windows}, {seq}")
    text = make_text(windows * seq + 1, seed)
    chars = "".join(sorted(_table_chars() | set(text)))  # one table for every size
    lookup = {c: i for i, c in enumerate(chars)}
    tokens = torch.tensor([lookup[c] for c in text], dtype=torch.int64)
    return Corpus(tokens, chars, seq)


class Windows(torch.utils.data.Dataset):
    """Window i of a corpus as (input, target): what a beginner hands to a DataLoader."""

    def __init__(self, corpus: Corpus):
        self.corpus = corpus

    def __len__(self) -> int:
        return self.corpus.windows

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        t, s = self.corpus.tokens, self.corpus.seq
        chunk = t[i * s: i * s + s + 1]
        return chunk[:-1], chunk[1:]


def order(windows: int, batches: int, batch: int, seed: int) -> torch.Tensor:
    """The window indices of the first `batches` batches, shape (batches, batch): the order a DataLoader
    with shuffle=True, drop_last=True and a generator seeded with `seed` visits them in (epoch after epoch)."""
    if windows % batch:
        raise ValueError(f"order: {windows} windows do not split into batches of {batch}; use a multiple")
    g = torch.Generator().manual_seed(seed)
    need = batches * batch
    perms = []
    for _ in range(-(-need // windows)):  # per epoch, as torch.utils.data draws from the generator:
        torch.empty((), dtype=torch.int64).random_(generator=g)  # the iterator's base seed for workers,
        perms.append(torch.randperm(windows, generator=g))  # the shuffle (RandomSampler),
        torch.randperm(windows, generator=g)  # and the sampler's draw for the remainder (empty) at the end
    return torch.cat(perms)[:need].view(batches, batch)
