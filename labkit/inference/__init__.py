"""LLM inference on the capstone's small GPT: a KV-cache decoder (MHA, GQA, MQA), bytes and FLOPs per
token, weight-only int8 and fp8, CUDA-graphed decode steps (and their parts timed alone) and static vs
continuous batching.

Used by: notebook 14, exercise 14.
"""
from labkit.inference.counts import Counts
from labkit.inference.decoder import Decoder
from labkit.inference.kvcache import KVCache, decode_attention, update_cache

__all__ = ["Counts", "Decoder", "KVCache", "decode_attention", "update_cache"]
