"""Graded cases for 14_llm_inference: other batch sizes, odd lengths, chunks, GQA and MQA, bf16, seeds."""
import torch

from labkit.exercises.ex14_llm_inference import decode_case, update_case


def update_cache_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    plan = [(1, 1, 7, 4, 1, "float32"), (4, 3, 33, 8, 1, "float32"), (5, 2, 29, 16, 7, "bfloat16"),
            (2, 4, 64, 32, 13, "float32"), (3, 1, 17, 8, 17, "float64")]
    return [update_case(g, *p, dev) for p in plan]


def decode_step_cases(g: torch.Generator, gpu: bool) -> list[dict]:
    dev = "cuda" if gpu else "cpu"
    plan = [(1, 4, 4, 9, 8, "float32"), (5, 8, 2, 37, 16, "float32"), (3, 6, 1, 41, 32, "float32"),
            (2, 8, 4, 65, 64, "bfloat16"), (7, 4, 2, 13, 8, "float64"), (4, 12, 3, 50, 16, "float32")]
    return [decode_case(g, *p, dev) for p in plan]


EXERCISES = {"update_cache": {"points": 1, "cases": update_cache_cases},
             "decode_step": {"points": 2, "cases": decode_step_cases}}
