"""The capstone: a small GPT trained the slow way, then made fast one measured step at a time.

data.py makes the corpus (generated, character-level); model.py the GPT; variants.py the steps;
train.py runs one variant (loss after N steps, tokens/s, memory); profile.py reads the profiler;
score.py turns a measured run into points; ddp.py is the several-GPU step (launched with torchrun).
"""
from labkit.capstone.data import Corpus, make_corpus
from labkit.capstone.model import GPT, GPTConfig
from labkit.capstone.score import Measured, Score, score
from labkit.capstone.train import Result, RunConfig, Trainer, run_variant
from labkit.capstone.variants import VARIANTS, Variant, chain, changes, variant

__all__ = ["Corpus", "make_corpus", "GPT", "GPTConfig", "Measured", "Score", "score", "Result", "RunConfig",
           "Trainer", "run_variant", "VARIANTS", "Variant", "chain", "changes", "variant"]
