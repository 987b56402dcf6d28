"""`labkit bench`: time labkit's Triton kernels against PyTorch eager, torch.compile and, where
Liger-Kernel is installed (`pip install labkit[peers]`), its production Triton kernels.

(labkit.bench, the timing function every notebook uses, is another thing: labkit.timing.bench.)

For each kernel and size: the median time (labkit.bench), the rate it implies (GB/s from the
kernel's minimum bytes, or TFLOP/s for matmul), that rate as a fraction of this machine's
measured ceiling, and the speed-up over the PyTorch baselines (>1: the Triton kernel is faster).
By default each call is timed as a training loop makes it (CUDA events around the call, L2 flushed
before each): the host's launch path counts whenever issuing the call takes the host longer than the
GPU spends on the flush and the call. --cuda-graph times replays of a CUDA graph of the calls instead
(every column alike): the GPU's time alone.
On a machine without a GPU it runs tiny sizes through the Triton interpreter (a smoke test:
the times mean nothing there).
Beside each time, "host us" is what issuing one call costs the host (microseconds, the GPU kept busy so
nothing waits on it), with eager PyTorch's and the production peers' (Liger-Kernel, quack) beside it, sampled
interleaved; backward rows add "floor host us", what an autograd Function that launches nothing costs the host
there (labkit.kernels._bench.autograd_floor): the part of a backward's host time that is PyTorch's, not the kernel's.
`--long-process` times the first case again after all the others (in one long process, as a training run calls
it) and prints both.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import labkit
from labkit import compat
from labkit.kernels._bench import BenchCase
from labkit.precision import tf32
from labkit.timing import Timing, bench, format_ms

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


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
    host_us: float | None = None  # the host's time to issue one call (see host_us)
    baseline_host_us: dict[str, float | None] = field(default_factory=dict)


def bench_cases() -> dict[str, BenchCase]:
    """Every benchmark the kernel modules offer, by name (imports the kernels: call labkit.setup() first)."""
    from labkit.kernels import BENCHMARKED

    return {case.name: case for module in BENCHMARKED.values() for case in module.bench_cases()}


def kernel_groups() -> dict[str, list[str]]:
    """Kernel module name -> its cases' names: `labkit bench attention` runs every case attention offers."""
    from labkit.kernels import BENCHMARKED

    return {name: [c.name for c in module.bench_cases()] for name, module in BENCHMARKED.items()}


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"labkit bench: cannot read size {text!r}: write it as N, MxN or MxNxK") from None
    if not dims or min(dims) <= 0:
        raise SystemExit(f"labkit bench: size {text!r} must have positive dimensions")
    return dims


def _time(fn, quick_cpu: bool, cuda_graph: bool = False) -> Timing:
    if quick_cpu:
        return bench(fn, warmup_ms=1, rep_ms=5, min_reps=3)
    return bench(fn, cuda_graph=cuda_graph)


HOST_CALLS, HOST_REPEATS = 20, 5  # calls issued back to back per sample, samples (median)


def host_us_paired(fns: dict, quick_cpu: bool) -> dict[str, float]:
    """Microseconds the host takes to issue one call of each of `fns`: HOST_CALLS calls timed with the host clock
    behind a GPU sleep long enough that no call waits for the GPU (nor for a full launch queue); median of
    HOST_REPEATS samples. The samples of all of `fns` are interleaved (labkit's, eager's, a peer's, then again in
    another order), so a change in the host's speed during the row (another process, the CPU's clock, where the
    scheduler puts the autograd thread) falls on each of them alike: measured on an H100 host, the same call's host
    time differed up to 2x between processes. On a CPU the call does its work, so this is its whole time."""
    calls, repeats = (2, 1) if quick_cpu else (HOST_CALLS, HOST_REPEATS)  # the interpreter is slow: a smoke test
    sleep = compat.gpu_sleep() or (lambda _cycles: None)  # without it the calls may wait for the GPU: an upper bound
    cycles = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        first_s = time.perf_counter() - t0
        # GPU cycles (~2 GHz) to sleep: three times what issuing the calls took the first time, 25 to 500 ms (the
        # callers time fn first, so its first call here compiles nothing)
        cycles[name] = int(2e9 * min(0.5, max(0.025, 3 * calls * first_s)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:  # each one first in turn
            fn = fns[name]
            if not quick_cpu:
                torch.cuda.synchronize()
                sleep(cycles[name])  # the GPU stays busy while the calls are issued: none waits for it
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    if not quick_cpu:
        torch.cuda.synchronize()
    return {name: statistics.median(v) for name, v in samples.items()}


def _ceiling(ceil, case: BenchCase, dtype_name: str) -> float | None:
    return ceil.matmul_tflops.get(dtype_name) if case.unit == "TFLOP/s" else ceil.copy_gbps


def run_kernel(case: BenchCase, sizes: list[str], dtypes: list[str], use_compile: bool, ceil,
               cuda_graph: bool = False) -> list[Row]:
    from tqdm.auto import tqdm

    quick_cpu = not labkit.current().is_gpu
    rows = []
    jobs = [(s, d) for s in sizes for d in dtypes]
    for size, dtype_name in tqdm(jobs, desc=case.name, unit="case", leave=False):
        with tf32(dtype_name == "tf32"):
            timed = None
            try:
                timed = case.make(parse_shape(size), DTYPES[dtype_name], use_compile)
                t = _time(timed.triton, quick_cpu, cuda_graph)
            except ValueError as exc:  # a size this kernel does not take: its own message says why
                tqdm.write(f"{case.name} {size} {dtype_name}: skipped: {str(exc).splitlines()[0][:200]}")
                continue
            except RuntimeError as exc:  # e.g. a call that a CUDA graph cannot capture (host copies, syncs)
                if not cuda_graph or timed is None:  # (making the inputs failed: not the capture)
                    raise
                tqdm.write(f"{case.name} {timed.shape} {dtype_name}: skipped, a CUDA graph cannot capture it: "
                           f"{str(exc).splitlines()[0][:120]}")
                continue
            base, hosted = {}, {"labkit": timed.triton}
            for name in case.baselines:
                fn = timed.baselines.get(name)
                try:
                    base[name] = _time(fn, quick_cpu, cuda_graph).median_ms if fn is not None else None
                except Exception as exc:  # a baseline that cannot run here (e.g. torch.compile without a compiler)
                    tqdm.write(f"{case.name} {timed.shape} {dtype_name}: {name} baseline failed: "
                               f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                    base[name] = None
                if name in HOST_PEERS and base[name] is not None:
                    hosted[name] = fn
            hosted.update(timed.host_only)
            base_host = host_us_paired(hosted, quick_cpu)  # labkit's and the peers' samples interleaved
            mine_host = base_host.pop("labkit")
        rows.append(make_row(case, timed.shape, dtype_name, t, timed.work, ceil, base, mine_host, base_host))
        del timed
        if labkit.current().is_gpu:
            torch.cuda.empty_cache()
    return rows


# the PyTorch ops and production peers whose host time is shown, and the autograd floor (labkit.kernels._bench)
HOST_PEERS = ("eager", "torch", "liger", "quack", "floor")


def make_row(case: BenchCase, shape: str, dtype_name: str, t: Timing, work: float, ceil, base: dict,
             mine_host: float | None = None, base_host: dict | None = None) -> Row:
    rate = (labkit.tflops if case.unit == "TFLOP/s" else labkit.gbps)(work, t.median_ms)
    c = _ceiling(ceil, case, dtype_name)
    return Row(case.name, shape, dtype_name, t.median_ms, t.spread, rate, case.unit, c, rate / c if c else None,
               base, {k: (v / t.median_ms if v else None) for k, v in base.items()}, mine_host, base_host or {})


def table(case: BenchCase, rows: list[Row]) -> str:
    kernel, unit = case.name, case.unit
    # A peer that is not installed here (every row None) gets no column.
    names = [n for n in case.baselines if n in ("eager", "torch") or any(r.baseline_ms.get(n) for r in rows)]
    hosts = [n for n in HOST_PEERS if any(r.baseline_host_us.get(n) for r in rows)]
    head = (["shape", "dtype", "time", unit, "of ceiling", "spread"] + [f"vs {n}" for n in names]
            + ["host us"] + [f"{n} host us" for n in hosts])
    body = []
    for r in rows:
        body.append([r.shape, r.dtype, format_ms(r.ms), _fmt_num(r.rate),
                     f"{r.fraction:.0%}" if r.fraction is not None else "n/a", f"{r.spread:.1%}"]
                    + [f"{_fmt_num(r.speedup[n])}x" if r.speedup.get(n) else "n/a" for n in names]
                    + [_fmt_us(r.host_us)] + [_fmt_us(r.baseline_host_us.get(n)) for n in hosts])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    ceiling = "copy bandwidth" if unit == "GB/s" else "matmul rate of that dtype"
    lines = [f"{kernel}  (rate from the minimum bytes/FLOPs; ceiling: this machine's {ceiling}; "
             f"vs X = X's time / Triton's time)",
             "  ".join(h.rjust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def _fmt_us(v: float | None) -> str:
    return f"{v:.1f}" if v is not None else "n/a"


def _fmt_num(v: float) -> str:
    return f"{v:,.1f}" if v >= 100 else f"{v:.3g}"


def save(rows: list[Row], path: Path, ceil: labkit.ceilings.Ceilings, timing: str = "events",
         long_process: list[dict] | None = None, plot: bool = True) -> list[Path]:
    """Write PATH.csv, PATH.json and (if `plot`) PATH.png (any suffix on PATH is dropped)."""
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
    from labkit.kernels._bench import peer_versions
    ceilings = asdict(ceil)  # the ones the rows were measured against
    base.with_suffix(".json").write_text(json.dumps({"machine": info, "peers": peer_versions(), "ceilings": ceilings,
                                                     "timing": timing, "rows": [asdict(r) for r in rows],
                                                     "long_process": long_process or []}, indent=1))
    if plot:
        _plot(rows, base.with_suffix(".png"), info)
    return [base.with_suffix(s) for s in (".csv", ".json", ".png")[:3 if plot else 2]]


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
    ap.add_argument("kernels", nargs="*", metavar="KERNEL", help="kernels to time (default: all; a kernel module's "
                    "name, e.g. attention, runs all its cases; a wrong name lists them)")
    ap.add_argument("--sizes", nargs="+", help="sizes for every chosen kernel: N, MxN (rows x cols; tensors x "
                    "elements for adam) or MxNxK (matmul); default: per kernel, tiny without a GPU")
    ap.add_argument("--dtypes", nargs="+", choices=list(DTYPES), help="dtypes (default: per kernel; fp32 on the CPU)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines (slow to compile)")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="GPU only: time every column as replays of a CUDA graph of many calls (the GPU's time "
                         "alone, without the host's launch path, and without flushing L2 between calls)")
    ap.add_argument("--long-process", action="store_true",
                    help="time the first case's first size again after all the others, and print both (a call's "
                         "time in a long process, e.g. after torch.compile ran, against a fresh one)")
    ap.add_argument("--save", type=Path, metavar="PATH", help="write PATH.csv, PATH.json and PATH.png")
    ap.add_argument("--timing-check", action="store_true",
                    help="compare labkit.bench with triton.testing.do_bench on a few kernels, then stop")
    args = ap.parse_args(argv)

    cfg = labkit.setup()
    cases, groups = bench_cases(), kernel_groups()
    # a module's name runs all its cases (layer_norm: its forward, backward and forward+backward), else a case's
    args.kernels = list(dict.fromkeys(k for name in args.kernels for k in groups.get(name, [name])))
    unknown = [k for k in args.kernels if k not in cases]
    if unknown:
        ap.error(f"unknown kernel(s) {', '.join(unknown)}; choose from {', '.join(cases)}")
    if args.timing_check:
        return timing_check()
    if args.cuda_graph and not cfg.is_gpu:
        ap.error("--cuda-graph needs a CUDA GPU (CUDA graphs replay GPU work); leave it out on this machine")
    timing = "cuda-graph" if args.cuda_graph else "events"
    # torch.compile on the CPU needs a C++ toolchain and a long first compile: GPU only by default.
    use_compile = cfg.is_gpu and not args.no_compile
    ceil = labkit.ceilings.get()
    print(f"{labkit.machine_info().get('GPU') if cfg.is_gpu else 'CPU (Triton interpreter: times are not meaningful)'}"
          f"; copy ceiling {ceil.copy_gbps:,.0f} GB/s; timing: {timing}")
    all_rows = []
    for name in args.kernels or list(cases):
        case = cases[name]
        sizes = args.sizes or list(case.gpu_sizes if cfg.is_gpu else case.cpu_sizes)
        dtypes = args.dtypes or list(case.gpu_dtypes if cfg.is_gpu else case.cpu_dtypes)
        rows = run_kernel(case, sizes, dtypes, use_compile, ceil, args.cuda_graph)
        print(table(case, rows) if rows else f"{case.name}: no size ran (see the lines above)", "\n", flush=True)
        all_rows += rows
        if args.save and rows:  # what ran so far stays saved if a long run is cut off
            save(all_rows, args.save, ceil, timing, plot=False)
    long_process = []
    if args.long_process and all_rows:
        first = all_rows[0]
        again = run_kernel(cases[first.kernel], [args.sizes[0] if args.sizes else first.shape], [first.dtype],
                           use_compile, ceil, args.cuda_graph)
        long_process = [{"when": when, **asdict(r)} for when, r in (("fresh", first), ("after all others", again[0]))]
        print(long_process_table(long_process), "\n", flush=True)
    if args.save:
        print("saved", ", ".join(str(p) for p in save(all_rows, args.save, ceil, timing, long_process)))
    return 0


def long_process_table(entries: list[dict]) -> str:
    """The first case timed fresh and again after all the others: time and host time per call, labkit's and
    each baseline's, and the ratio later / fresh."""
    fresh, later = entries
    names = [n for n in fresh["baseline_ms"] if fresh["baseline_ms"].get(n) and later["baseline_ms"].get(n)]
    lines = [f"long process: {fresh['kernel']} {fresh['shape']} {fresh['dtype']}, fresh vs after all the others",
             f"{'':>15} {'fresh':>10} {'later':>10} {'later/fresh':>11}"]
    pairs = [("labkit", fresh["ms"], later["ms"]), ("labkit host us", fresh["host_us"], later["host_us"])]
    pairs += [(n, fresh["baseline_ms"][n], later["baseline_ms"][n]) for n in names]
    pairs += [(f"{n} host us", fresh["baseline_host_us"].get(n), later["baseline_host_us"].get(n))
              for n in HOST_PEERS if fresh["baseline_host_us"].get(n)]
    for name, a, b in pairs:
        if a and b:
            shown = (f"{a:>10.1f} {b:>10.1f}" if "host" in name else f"{format_ms(a):>10} {format_ms(b):>10}")
            lines.append(f"{name:>15} {shown} {b / a:>10.2f}x")
    return "\n".join(lines)
