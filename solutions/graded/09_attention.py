"""Graded cases for 09_attention: other lengths (1 token, odd, several tiles), head dims, dtypes, layouts, seeds;
large logits (q times 30), which need the running max, in cases longer than a key tile of 64 (or 128 on a GPU)."""
import torch

from labkit.exercises.ex09_attention import random_case


def flash_attention_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    bf16, fp16 = torch.bfloat16, torch.float16
    if gpu:
        plan = [((1, 1, 1, 64), fp16, False, "bhnd", 1), ((2, 3, 129, 64), bf16, True, "bhnd", 1),
                ((1, 4, 1000, 128), bf16, False, "bhnd", 30), ((2, 2, 777, 128), fp16, True, "bnhd", 30),
                ((1, 2, 513, 32), bf16, True, "bhnd", 1), ((3, 1, 300, 16), fp16, False, "bnhd", 30)]
    else:  # the Triton interpreter runs every program in Python: a few dozen tokens
        plan = [((1, 1, 1, 16), fp16, False, "bhnd", 1), ((2, 1, 29, 16), bf16, True, "bhnd", 1),
                ((1, 2, 53, 32), fp16, False, "bnhd", 1), ((1, 1, 67, 64), bf16, True, "bhnd", 30),
                ((1, 1, 40, 64), fp16, True, "bnhd", 1), ((1, 2, 50, 32), bf16, False, "bhnd", 1),
                ((1, 1, 73, 16), fp16, False, "bnhd", 30)]
    return [random_case(g, shape, dtype, causal, dev, layout, scale) for shape, dtype, causal, layout, scale in plan]


EXERCISES = {"flash_attention": {"points": 2, "cases": flash_attention_cases}}
