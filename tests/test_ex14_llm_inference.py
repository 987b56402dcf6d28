"""Exercise 14's hidden cases need the idea: a step that ignores the cache, the positions or the GQA grouping fails."""
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from labkit.exercises import ex14_llm_inference as ex
from labkit.exercises.observe import compare
from labkit.inference.kvcache import decode_attention, update_cache

GRADED = Path(__file__).resolve().parent.parent / "solutions" / "graded" / "14_llm_inference.py"


def hidden(name: str) -> list[dict]:
    spec = importlib.util.spec_from_file_location("graded14", GRADED)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.EXERCISES[name]["cases"](torch.Generator().manual_seed(1), False)


def right_step(q, k, v, ck, cv, pos):
    update_cache(ck, cv, k.unsqueeze(2), v.unsqueeze(2), pos)
    return decode_attention(q.double(), ck.double(), cv.double(), pos + 1).to(q.dtype)


def no_cache(q, k, v, ck, cv, pos):  # attends to the new token alone
    update_cache(ck, cv, k.unsqueeze(2), v.unsqueeze(2), pos)
    return v.repeat_interleave(q.shape[1] // k.shape[1], dim=1)


def whole_cache(q, k, v, ck, cv, pos):  # ignores the positions when reading
    update_cache(ck, cv, k.unsqueeze(2), v.unsqueeze(2), pos)
    return decode_attention(q.double(), ck.double(), cv.double(), torch.full_like(pos, ck.shape[2])).to(q.dtype)


def modulo_heads(q, k, v, ck, cv, pos):  # query head h reads kv head h % kv_heads
    update_cache(ck, cv, k.unsqueeze(2), v.unsqueeze(2), pos)
    B, H, D = q.shape
    idx = torch.arange(H) % ck.shape[1]
    out = torch.empty(B, H, D, dtype=torch.float64)
    for b in range(B):
        n = int(pos[b]) + 1
        for h in range(H):
            p = torch.softmax(ck[b, idx[h], :n].double() @ q[b, h].double() / math.sqrt(D), 0)
            out[b, h] = p @ cv[b, idx[h], :n].double()
    return out.to(q.dtype)


def at_zero(ck, cv, k, v, pos):  # ignores the positions when writing
    return update_cache(ck, cv, k, v, torch.zeros_like(pos))


def passes(call, fn, case) -> bool:
    return not compare(case["expected"], call(fn, case["args"]), case["rtol"], case["atol"])


def test_the_reference_passes_every_hidden_and_visible_case():
    for case in hidden("decode_step") + ex.visible_decode_step():
        assert passes(ex.call_decode_step, right_step, case), case["about"]
    for case in hidden("update_cache") + ex.visible_update_cache():
        assert passes(ex.call_update_cache, update_cache, case), case["about"]


@pytest.mark.parametrize("wrong", [no_cache, whole_cache, modulo_heads])
def test_a_step_without_the_idea_fails_hidden_cases(wrong):
    failed = [c["about"] for c in hidden("decode_step") if not passes(ex.call_decode_step, wrong, c)]
    assert len(failed) >= 3, failed


def test_writing_at_position_zero_fails_hidden_cases():
    failed = [c["about"] for c in hidden("update_cache") if not passes(ex.call_update_cache, at_zero, c)]
    assert len(failed) >= 4, failed
