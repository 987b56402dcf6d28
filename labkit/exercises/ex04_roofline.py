"""Exercise 04, roofline: `matmul_flops_bytes(m, n, k, itemsize)` and `attainable_tflops(...)`."""
from __future__ import annotations

from labkit.exercises.observe import snapshot
from labkit.exercises.spec import Function

NOTEBOOK = "04_roofline"


def call_matmul_flops_bytes(fn, args):
    out = fn(args["m"], args["n"], args["k"], args["itemsize"])
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        return {"returns (flops, bytes)": False}
    return {"returns (flops, bytes)": True, "FLOPs": snapshot(out[0]), "bytes": snapshot(out[1])}


def flops_bytes_case(about: str, m: int, n: int, k: int, itemsize: int, flops: int, nbytes: int) -> dict:
    return {"about": about, "args": {"m": m, "n": n, "k": k, "itemsize": itemsize},
            "expected": {"returns (flops, bytes)": True, "FLOPs": flops, "bytes": nbytes}}


def visible_matmul_flops_bytes() -> list[dict]:
    # worked by hand: 2*m*n*k FLOPs; (m*k + k*n + m*n) elements read or written once.
    return [flops_bytes_case("m=2, n=3, k=4, fp32", 2, 3, 4, 4, 48, 104),
            flops_bytes_case("m=n=k=1024, bf16", 1024, 1024, 1024, 2, 2147483648, 6291456)]


def call_attainable_tflops(fn, args):
    out = fn(args["flops"], args["nbytes"], args["peak_tflops"], args["peak_gbps"])
    return {"attainable TFLOP/s": snapshot(out)}


def attainable_case(about: str, flops: float, nbytes: float, peak_tflops: float, peak_gbps: float,
                    expected: float) -> dict:
    return {"about": about,
            "args": {"flops": flops, "nbytes": nbytes, "peak_tflops": peak_tflops, "peak_gbps": peak_gbps},
            "expected": {"attainable TFLOP/s": expected}, "rtol": 1e-9}


def visible_attainable_tflops() -> list[dict]:
    # worked by hand: intensity 1 FLOP/B * 1000 GB/s = 1 TFLOP/s (bandwidth-bound);
    # intensity 1000 FLOP/B * 1000 GB/s = 1000 TFLOP/s > 50, so compute-bound at 50.
    return [attainable_case("1e9 FLOPs over 1e9 bytes, 50 TFLOP/s, 1000 GB/s", 1e9, 1e9, 50.0, 1000.0, 1.0),
            attainable_case("1e12 FLOPs over 1e9 bytes, 50 TFLOP/s, 1000 GB/s", 1e12, 1e9, 50.0, 1000.0, 50.0)]


FUNCTIONS = [
    Function("matmul_flops_bytes", call_matmul_flops_bytes, visible_matmul_flops_bytes),
    Function("attainable_tflops", call_attainable_tflops, visible_attainable_tflops),
]
