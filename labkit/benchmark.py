"""`labkit bench`: time labkit's Triton kernels against PyTorch eager and torch.compile.

(This module is labkit.benchmark, not labkit.bench: a submodule of that name would replace the
labkit.bench() timing function on the package as soon as it was imported.)

For each kernel and size: the median time (labkit.bench), the rate it implies (GB/s from the
kernel's minimum bytes, or TFLOP/s for matmul), that rate as a fraction of this machine's
measured ceiling, and the speed-up over the PyTorch baselines (>1: the Triton kernel is faster).
On a machine without a GPU it runs tiny sizes through the Triton interpreter (a smoke test:
the times mean nothing there).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

import labkit
from labkit.timing import Timing, bench, format_ms

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Case:
    """One benchmark: the Triton function, its baselines and how much work one call does."""

    shape: str
    dtype: str
    triton: Callable[[], object]
    baselines: dict[str, Callable[[], object] | None]
    work: float  # bytes (memory-bound kernels) or FLOPs (matmul)


@dataclass
class Row:
    kernel: str
    shape: str
    dtype: str
    ms: float
    spread: float
    rate: float
    unit: str
    ceiling: float | None
    fraction: float | None
    baseline_ms: dict[str, float | None]
    speedup: dict[str, float | None]


# kernel -> (baseline column names, unit, default GPU sizes, default CPU sizes, default GPU dtypes)
KERNELS: dict[str, tuple[tuple[str, str], str, list[str], list[str], list[str]]] = {
    "vector_add": (("eager", "compile"), "GB/s", ["1048576", "16777216", "134217728"], ["4097"], ["fp32", "bf16"]),
    "bias_gelu": (("eager", "compile"), "GB/s", ["4096x4096", "16384x4096"], ["33x129"], ["fp32", "bf16"]),
    "bias_gelu_bwd": (("eager", "compile"), "GB/s", ["4096x4096", "16384x4096"], ["33x129"], ["fp32", "bf16"]),
    "softmax": (("eager", "compile"), "GB/s", ["65536x1024", "16384x4096", "4096x16384", "256x65536"], ["17x129"],
                ["fp32", "bf16"]),
    "layer_norm": (("eager", "compile"), "GB/s", ["65536x1024", "16384x4096", "8192x8192"], ["17x129"],
                   ["fp32", "bf16"]),
    "layer_norm_bwd": (("eager", "compile"), "GB/s", ["65536x1024", "16384x4096", "8192x8192"], ["17x129"],
                       ["fp32", "bf16"]),
    "adam": (("foreach", "fused"), "GB/s", ["200x1048576", "8x16777216"], ["2x500"], ["fp32", "bf16"]),
    "matmul": (("torch", "compile"), "TFLOP/s", ["4096", "8192"], ["64"], ["bf16", "fp16", "tf32"]),
}
# Attention (sizes BxHxNxD): forward and backward, causal or not, against each SDPA backend, naive eager
# attention and torch.compile of it. `labkit bench attention` runs all four.
_ATTN = (("flash", "efficient", "cudnn", "math", "naive", "compile"), "TFLOP/s",
         ["4x16x1024x128", "4x16x4096x128", "1x16x16384x128"], ["1x2x37x64"], ["bf16"])
KERNELS.update({name: _ATTN for name in ("attention_fwd", "attention_causal_fwd", "attention_bwd",
                                         "attention_causal_bwd")})
ALIASES = {"attention": ["attention_fwd", "attention_causal_fwd", "attention_bwd", "attention_causal_bwd"]}
CPU_DTYPES = {name: ["bf16"] for name in ALIASES["attention"]}  # the kernel takes fp16/bf16 only


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"labkit bench: cannot read size {text!r}: write it as N, MxN or MxNxK") from None
    if not dims or min(dims) <= 0:
        raise SystemExit(f"labkit bench: size {text!r} must have positive dimensions")
    return dims


def _rows_cols(dims: tuple[int, ...]) -> tuple[int, int]:
    return (dims[0], dims[1]) if len(dims) >= 2 else (1, dims[0])


def _maybe_compile(fn, use_compile: bool):
    if not use_compile:
        return None
    try:  # the backward rows call autograd.grad(retain_graph=True), which donated buffers forbid
        import torch._functorch.config as functorch_config
        functorch_config.donated_buffer = False
    except (ImportError, AttributeError):
        pass
    return torch.compile(fn)


def make_case(kernel: str, size: str, dtype_name: str, use_compile: bool) -> Case:
    """Inputs of the given size and dtype for one kernel, with its Triton call and baselines."""
    from labkit import kernels  # the modules then sit in sys.modules (kernels.softmax is the function)

    dev = labkit.current().device
    dtype = DTYPES[dtype_name]
    dims = parse_shape(size)

    def randn(*shape):
        return torch.randn(*shape, device=dev, dtype=dtype)

    if kernel == "vector_add":
        n = math.prod(dims)
        x, y = randn(n), randn(n)
        ref = sys.modules["labkit.kernels.vector_add"].reference
        return Case(str(n), dtype_name, lambda: kernels.vector_add(x, y),
                    {"eager": lambda: ref(x, y), "compile": _bind(_maybe_compile(ref, use_compile), x, y)},
                    kernels.vector_add.min_bytes(n, dtype))
    if kernel in ("bias_gelu", "bias_gelu_bwd"):
        M, N = _rows_cols(dims)
        mod = sys.modules["labkit.kernels.bias_gelu"]
        x, b = randn(M, N), randn(N)
        if kernel == "bias_gelu":
            return Case(f"{M}x{N}", dtype_name, lambda: kernels.bias_gelu(x, b),
                        {"eager": lambda: mod.reference(x, b),
                         "compile": _bind(_maybe_compile(mod.reference, use_compile), x, b)},
                        mod.min_bytes((M, N), dtype))
        dy = randn(M, N)
        x.requires_grad_(True)
        b.requires_grad_(True)
        return Case(f"{M}x{N}", dtype_name, _grad_fn(kernels.bias_gelu, (x, b), dy),
                    {"eager": _grad_fn(mod.reference, (x, b), dy),
                     "compile": _grad_fn(_maybe_compile(mod.reference, use_compile), (x, b), dy)},
                    mod.min_bytes((M, N), dtype, backward=True))
    if kernel == "softmax":
        M, N = _rows_cols(dims)
        mod = sys.modules["labkit.kernels.softmax"]
        x = randn(M, N)
        return Case(f"{M}x{N}", dtype_name, lambda: kernels.softmax(x),
                    {"eager": lambda: mod.reference(x), "compile": _bind(_maybe_compile(mod.reference, use_compile), x)},
                    mod.min_bytes((M, N), dtype))
    if kernel in ("layer_norm", "layer_norm_bwd"):
        M, N = _rows_cols(dims)
        mod = sys.modules["labkit.kernels.layer_norm"]
        x, w, b = randn(M, N), randn(N), randn(N)
        if kernel == "layer_norm":
            return Case(f"{M}x{N}", dtype_name, lambda: kernels.layer_norm(x, w, b),
                        {"eager": lambda: mod.reference(x, w, b),
                         "compile": _bind(_maybe_compile(mod.reference, use_compile), x, w, b)},
                        mod.min_bytes((M, N), dtype))
        dy = randn(M, N)
        for t in (x, w, b):
            t.requires_grad_(True)
        return Case(f"{M}x{N}", dtype_name, _grad_fn(kernels.layer_norm, (x, w, b), dy),
                    {"eager": _grad_fn(mod.reference, (x, w, b), dy),
                     "compile": _grad_fn(_maybe_compile(mod.reference, use_compile), (x, w, b), dy)},
                    mod.min_bytes((M, N), dtype, backward=True))
    if kernel == "adam":
        T, n = _rows_cols(dims) if len(dims) >= 2 else (1, dims[0])
        mod = sys.modules["labkit.kernels.adam"]

        def params():
            ps = [torch.nn.Parameter(torch.randn(n, device=dev, dtype=dtype)) for _ in range(T)]
            for p in ps:
                p.grad = torch.randn_like(p)
            return ps

        opt = kernels.TritonAdamW(params())
        foreach = torch.optim.AdamW(params(), foreach=True)
        try:
            fused = torch.optim.AdamW(params(), fused=True)
        except (RuntimeError, ValueError):
            fused = None  # fused AdamW is not available for this device/dtype
        return Case(f"{T}x{n}", dtype_name, opt.step,
                    {"foreach": foreach.step, "fused": fused.step if fused else None},
                    mod.min_bytes(T * n, dtype))
    if kernel == "matmul":
        M, N, K = (dims * 3)[:3] if len(dims) == 1 else (dims + dims[-1:])[:3]
        mod = sys.modules["labkit.kernels.matmul"]
        a, b = randn(M, K), randn(K, N)
        return Case(f"{M}x{N}x{K}", dtype_name, lambda: kernels.matmul(a, b),
                    {"torch": lambda: torch.matmul(a, b), "compile": None}, mod.flops(M, N, K))
    if kernel.startswith("attention"):
        c = sys.modules["labkit.kernels.attention"].bench_case(
            size, dtype, causal="causal" in kernel, backward=kernel.endswith("_bwd"), use_compile=use_compile)
        return Case(c["shape"], dtype_name, c["fn"], c["baselines"], c["flops"])
    raise SystemExit(f"labkit bench: unknown kernel {kernel!r}; choose from {', '.join(KERNELS)}")


def _bind(fn, *args):
    return (lambda: fn(*args)) if fn is not None else None


def _grad_fn(fn, inputs, dy):
    """A call of the backward alone: the forward graph is built once and kept (retain_graph)."""
    if fn is None:
        return None
    y = fn(*inputs)
    return lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True)


def _time(fn, quick_cpu: bool) -> Timing:
    if quick_cpu:
        return bench(fn, warmup_ms=1, rep_ms=5, min_reps=3)
    return bench(fn)


def _ceiling(ceil, kernel: str, dtype_name: str) -> float | None:
    if KERNELS[kernel][1] == "TFLOP/s":
        return ceil.matmul_tflops.get(dtype_name)
    return ceil.copy_gbps


def run_kernel(kernel: str, sizes: list[str], dtypes: list[str], use_compile: bool, ceil) -> list[Row]:
    from tqdm.auto import tqdm

    names, unit, *_ = KERNELS[kernel]
    quick_cpu = not labkit.current().is_gpu
    rows = []
    jobs = [(s, d) for s in sizes for d in dtypes]
    for size, dtype_name in tqdm(jobs, desc=kernel, unit="case", leave=False):
        old_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
        try:
            case = make_case(kernel, size, dtype_name, use_compile)
            t = _time(case.triton, quick_cpu)
            base = {}
            for name in names:
                fn = case.baselines.get(name)
                try:
                    base[name] = _time(fn, quick_cpu).median_ms if fn is not None else None
                except Exception as exc:  # a baseline that cannot run here (e.g. torch.compile without a compiler)
                    tqdm.write(f"{kernel} {case.shape} {dtype_name}: {name} baseline failed: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:120]}")
                    base[name] = None
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old_tf32
        rate = (labkit.tflops if unit == "TFLOP/s" else labkit.gbps)(case.work, t.median_ms)
        c = _ceiling(ceil, kernel, dtype_name)
        rows.append(Row(kernel, case.shape, dtype_name, t.median_ms, t.spread, rate, unit, c,
                        rate / c if c else None, base,
                        {k: (v / t.median_ms if v else None) for k, v in base.items()}))
        del case
        if labkit.current().is_gpu:
            torch.cuda.empty_cache()
    return rows


def table(kernel: str, rows: list[Row]) -> str:
    names, unit, *_ = KERNELS[kernel]
    head = ["shape", "dtype", "time", unit, "of ceiling", "spread"] + [f"vs {n}" for n in names]
    body = []
    for r in rows:
        body.append([r.shape, r.dtype, format_ms(r.ms), _fmt_num(r.rate),
                     f"{r.fraction:.0%}" if r.fraction is not None else "n/a", f"{r.spread:.1%}"]
                    + [f"{_fmt_num(r.speedup[n])}x" if r.speedup.get(n) else "n/a" for n in names])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    ceiling = "copy bandwidth" if unit == "GB/s" else "matmul rate of that dtype"
    lines = [f"{kernel}  (rate from the minimum bytes/FLOPs; ceiling: this machine's {ceiling}; "
             f"vs X = X's time / Triton's time)",
             "  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def _fmt_num(v: float) -> str:
    return f"{v:,.1f}" if v >= 100 else f"{v:.3g}"


def save(rows: list[Row], path: Path) -> list[Path]:
    """Write PATH.csv, PATH.json and PATH.png (any suffix on PATH is dropped)."""
    base = path.with_suffix("") if path.suffix in (".csv", ".json", ".png") else path
    base.parent.mkdir(parents=True, exist_ok=True)
    names = sorted({n for r in rows for n in r.baseline_ms})
    with open(base.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "shape", "dtype", "ms", "spread", "rate", "unit", "ceiling", "fraction"]
                   + [f"{n}_ms" for n in names] + [f"speedup_vs_{n}" for n in names])
        for r in rows:
            w.writerow([r.kernel, r.shape, r.dtype, r.ms, r.spread, r.rate, r.unit, r.ceiling, r.fraction]
                       + [r.baseline_ms.get(n) for n in names] + [r.speedup.get(n) for n in names])
    info = labkit.machine_info()
    base.with_suffix(".json").write_text(json.dumps({"machine": info, "rows": [asdict(r) for r in rows]}, indent=1))
    _plot(rows, base.with_suffix(".png"), info)
    return [base.with_suffix(s) for s in (".csv", ".json", ".png")]


def _plot(rows: list[Row], path: Path, info: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels = list(dict.fromkeys(r.kernel for r in rows))
    cols = min(3, len(kernels))
    nrows = math.ceil(len(kernels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False)
    for ax, kernel in zip(axes.flat, kernels):
        mine = [r for r in rows if r.kernel == kernel]
        unit = mine[0].unit
        for dtype in dict.fromkeys(r.dtype for r in mine):
            rs = [r for r in mine if r.dtype == dtype]
            xs = range(len(rs))
            ax.plot(xs, [r.rate for r in rs], "o-", label=f"triton {dtype}")
            for name in rs[0].baseline_ms:
                ys = [r.rate * r.ms / r.baseline_ms[name] if r.baseline_ms.get(name) else float("nan") for r in rs]
                if any(not math.isnan(y) for y in ys):
                    ax.plot(xs, ys, "x--", label=f"{name} {dtype}")
            ax.set_xticks(list(xs), [r.shape for r in rs], rotation=20, fontsize=7)
            ceiling = rs[0].ceiling
            if ceiling:
                ax.axhline(ceiling, color="gray", lw=0.8, ls=":")
        if unit == "GB/s" and mine[0].ceiling:
            ax.axhline(mine[0].ceiling, color="gray", lw=1, ls=":", label="copy ceiling")
        ax.set_title(kernel)
        ax.set_xlabel("shape")
        ax.set_ylabel(unit)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(kernels):]:
        ax.set_visible(False)
    fig.suptitle(f"labkit kernels on {info.get('GPU') if info.get('GPU') not in (None, 'none') else 'the CPU'}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def timing_check() -> int:
    """labkit.bench vs triton.testing.do_bench (median) on a copy, a softmax and a matmul.

    Each helper runs five times, alternating, and the median of each helper's medians is compared.
    """
    if not labkit.current().is_gpu:
        print("labkit bench --timing-check: needs a GPU (triton.testing.do_bench times with CUDA events); skipped.")
        return 0
    import triton.testing

    from labkit import kernels

    dev = labkit.current().device
    src = torch.randn(2**26, device=dev)
    dst = torch.empty_like(src)
    x = torch.randn(16384, 4096, device=dev, dtype=torch.bfloat16)
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    cases = {"copy 256 MiB fp32": lambda: dst.copy_(src),
             "softmax 16384x4096 bf16": lambda: kernels.softmax(x),
             "matmul 4096^3 bf16": lambda: kernels.matmul(a, b)}
    print(f"{'kernel':<26} {'labkit.bench':>13} {'do_bench':>12} {'diff':>7}  spread")
    worst = 0.0
    rounds = 5  # alternate the two helpers, so a drift of the GPU's clock hits both alike
    for name, fn in cases.items():
        fn()
        runs, theirs_runs = [], []
        for r in range(rounds):
            if r % 2:
                theirs_runs.append(triton.testing.do_bench(fn, return_mode="median"))
                runs.append(bench(fn))
            else:
                runs.append(bench(fn))
                theirs_runs.append(triton.testing.do_bench(fn, return_mode="median"))
        ours = sorted(runs, key=lambda t: t.median_ms)[rounds // 2]
        theirs = sorted(theirs_runs)[rounds // 2]
        diff = (ours.median_ms - theirs) / theirs
        worst = max(worst, abs(diff))
        print(f"{name:<26} {format_ms(ours.median_ms):>13} {format_ms(theirs):>12} {diff:>+7.1%}  {ours.spread:.1%}")
    print(f"largest difference {worst:.1%}: {'within' if worst <= 0.03 else 'OUTSIDE'} the 3% the course asks for")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labkit bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("kernels", nargs="*", metavar="KERNEL",
                    help=f"kernels to time (default: all): {', '.join(KERNELS)}; attention = its four cases")
    ap.add_argument("--sizes", nargs="+", help="sizes for every chosen kernel: N, MxN (rows x cols; tensors x "
                    "elements for adam) or MxNxK (matmul); default: per kernel, tiny without a GPU")
    ap.add_argument("--dtypes", nargs="+", choices=list(DTYPES), help="dtypes (default: per kernel; fp32 on the CPU)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines (slow to compile)")
    ap.add_argument("--save", type=Path, metavar="PATH", help="write PATH.csv, PATH.json and PATH.png")
    ap.add_argument("--timing-check", action="store_true",
                    help="compare labkit.bench with triton.testing.do_bench on a few kernels, then stop")
    args = ap.parse_args(argv)
    args.kernels = [k for name in args.kernels for k in ALIASES.get(name, [name])]
    unknown = [k for k in args.kernels if k not in KERNELS]
    if unknown:
        ap.error(f"unknown kernel(s) {', '.join(unknown)}; choose from {', '.join(KERNELS)}")

    cfg = labkit.setup()
    if args.timing_check:
        return timing_check()
    # torch.compile on the CPU needs a C++ toolchain and a long first compile: GPU only by default.
    use_compile = cfg.is_gpu and not args.no_compile
    ceil = labkit.ceilings.get()
    print(f"{labkit.machine_info().get('GPU') if cfg.is_gpu else 'CPU (Triton interpreter: times are not meaningful)'}"
          f"; copy ceiling {ceil.copy_gbps:,.0f} GB/s")
    all_rows = []
    for kernel in args.kernels or list(KERNELS):
        _, _, gpu_sizes, cpu_sizes, gpu_dtypes = KERNELS[kernel]
        sizes = args.sizes or (gpu_sizes if cfg.is_gpu else cpu_sizes)
        dtypes = args.dtypes or (gpu_dtypes if cfg.is_gpu else CPU_DTYPES.get(kernel, ["fp32"]))
        rows = run_kernel(kernel, sizes, dtypes, use_compile, ceil)
        print(table(kernel, rows), "\n", flush=True)
        all_rows += rows
    if args.save:
        print("saved", ", ".join(str(p) for p in save(all_rows, args.save)))
    return 0
