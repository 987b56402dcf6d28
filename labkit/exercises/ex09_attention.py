"""Exercise 09, attention: `flash_attention(q, k, v, causal)`, a Triton FlashAttention forward whose
online-softmax update the student writes; it must launch the notebook's own @triton.jit kernel."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from labkit.exercises import launches
from labkit.exercises.inputs import here
from labkit.exercises.observe import expect_tensor, snapshot
from labkit.exercises.spec import Function

NOTEBOOK = "09_attention"
RAN_OWN_KERNEL = "a @triton.jit kernel defined in your notebook wrote the output returned"
# bf16 keeps 8 significant bits, fp16 11: the output is rounded once to its dtype, the reference is exact
TOL = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def _layout(base: torch.Tensor, layout: str) -> torch.Tensor:
    """q, k or v as (B, H, N, d): `base` itself ("bhnd"), or a (B, N, H, d) tensor seen through transpose(1, 2)."""
    return base.transpose(1, 2) if layout == "bnhd" else base


def call_flash_attention(fn, args):
    device = torch.device(args.get("device", "cpu"))
    q, k, v = (_layout(args[n].to(device), args.get("layout", "bhnd")) for n in ("q", "k", "v"))
    with launches.record() as launched:
        out = fn(q, k, v, args["causal"])
        if device.type == "cuda":
            torch.cuda.synchronize()
    return {"output": snapshot(out), RAN_OWN_KERNEL: launches.produced(out, launched)}


def flash_attention_case(about: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, device: str,
                         layout: str = "bhnd") -> dict:
    """flash_attention on (B, H, N, d) inputs (stored as (B, N, H, d) for layout "bnhd"), against SDPA in float64."""
    qs, ks, vs = (_layout(t, layout).double() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
    tol = TOL[q.dtype]
    return {"about": about, "args": {"q": q, "k": k, "v": v, "causal": causal, "device": device, "layout": layout},
            "expected": {"output": expect_tensor(ref.to(q.dtype), device), RAN_OWN_KERNEL: True},
            "rtol": tol, "atol": tol}


def random_case(g: torch.Generator, shape: tuple[int, int, int, int], dtype: torch.dtype, causal: bool, device: str,
                layout: str = "bhnd", scale: float = 1.0) -> dict:
    """A case with fresh random q, k, v of (B, H, N, d) `shape` drawn from `g`; q times `scale` (30: logits of
    about ±100, whose exponentials overflow float32 unless the running max is subtracted)."""
    B, H, N, D = shape
    stored = (B, N, H, D) if layout == "bnhd" else shape
    q, k, v = (torch.randn(stored, generator=g) for _ in range(3))
    q, k, v = (q * scale).to(dtype), k.to(dtype), v.to(dtype)
    about = (f"q, k, v of shape {shape} {str(dtype).removeprefix('torch.')}, {'causal' if causal else 'no mask'}"
             f"{', a transposed (B, N, H, d) layout' if layout == 'bnhd' else ''}"
             f"{f', large logits (q times {scale:g})' if scale != 1 else ''}, on {device}")
    return flash_attention_case(about, q, k, v, causal, device, layout)


def visible_flash_attention() -> list[dict]:
    """Odd lengths spanning several key tiles (a kernel that never rescales its running sums is wrong past the first):
    a few dozen tokens in the interpreter, which runs small tiles; past 128 tokens on a GPU, whose tiles are larger.
    The hidden cases' classes with other values: both dtypes, causal or not, the transposed layout, large logits."""
    g = torch.Generator().manual_seed(9)
    dev = str(here())
    n1, n2, n3 = (37, 45, 41) if torch.device(dev).type == "cpu" else (300, 145, 200)
    return [random_case(g, (1, 2, n1, 64), torch.bfloat16, False, dev),
            random_case(g, (2, 1, n2, 16), torch.float16, True, dev),
            random_case(g, (1, 1, 23, 32), torch.bfloat16, True, dev),
            random_case(g, (1, 1, n3, 16), torch.float16, False, dev, "bnhd", scale=30.0)]


# labkit's own FlashAttention answers this exercise: stubs while it is graded (labkit.grading.answers)
ANSWERS = tuple(f"labkit.kernels.attention.{n}" for n in ("attention", "attention_forward", "Attention",
                                                           "attn_fwd_kernel"))
FUNCTIONS = [Function("flash_attention", call_flash_attention, visible_flash_attention, prepare=launches.bind,
                      requires_triton=True, answers=ANSWERS)]
