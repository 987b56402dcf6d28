"""Issue 19's full-size check on a GPU host: correctness at full size, then each target case timed
against eager / torch.compile / cuBLAS / Liger-Kernel, with tile sweeps; a compact table last.

    python -m labkit.kernels._gpu_check [--sweep] [--out DIR] [--only SECTION ...] [--compile {no,only,both}]
    python -m labkit.kernels._gpu_check --summary --out DIR

torch.compile's baselines can run in a separate process (--compile only): Inductor's worker threads
and pools then cannot disturb the other timings.

Rates are from the minimum bytes, as a fraction of the measured copy bandwidth (as `labkit bench`).
Results go to DIR/results.jsonl as they come, so a run cut short keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

import labkit

T0 = time.time()
ROWS: list[dict] = []


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true", help="also time tile variants")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    ap.add_argument("--budget", type=float, default=200.0, help="seconds; later sections are skipped past it")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--compile", choices=("no", "only", "both"), default="both")
    ap.add_argument("--summary", action="store_true", help="print the table of DIR/results.jsonl and stop")
    args = ap.parse_args()
    global MODE
    MODE = args.compile
    if args.summary:
        ROWS.extend(json.loads(line) for line in (args.out / "results.jsonl").read_text().splitlines() if line)
        summary()
        return
    labkit.setup()
    gpu = labkit.current().is_gpu
    out = args.out / "results.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    from labkit.kernels._bench import peer, peer_versions
    info = labkit.machine_info()
    print(f"# {info.get('GPU')} torch {torch.__version__} triton {info.get('triton')} peers {peer_versions()}",
          flush=True)
    copy = copy_gbps() if gpu else 1.0
    print(f"# copy ceiling {copy:,.0f} GB/s", flush=True)

    def rec(case, shape, dtype, variant, ms, nbytes=None, ref=None, **extra):
        if ms is None or (MODE == "only" and variant != "compile") or (MODE == "no" and variant == "compile"):
            return
        if callable(ms):  # a timing that may fail (a peer's limit): say so and go on
            try:
                ms = ms()
            except Exception as exc:
                print(f"# {case} {shape} {dtype} {variant}: {type(exc).__name__}: {str(exc)[:150]}", flush=True)
                return
        row = dict(case=case, shape=shape, dtype=dtype, variant=variant, ms=ms,
                   frac=(nbytes / ms / 1e6 / copy) if nbytes and ms else None, **extra)
        if ref:
            row["ref"] = ref
        ROWS.append(row)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        fr = f"{row['frac']:.0%}" if row["frac"] is not None else ""
        print(f"{time.time() - T0:6.1f}s {case:<14} {shape:<14} {dtype:<5} {variant:<26} {ms * 1e3:9.1f} us {fr:>5}"
              f" {' '.join(f'{k}={v}' for k, v in extra.items())}", flush=True)

    sections = [("softmax", sec_softmax), ("layer_norm", sec_layer_norm), ("bias_gelu", sec_bias_gelu),
                ("vector_add", sec_vector_add), ("matmul", sec_matmul), ("adam", sec_adam)]
    for name, fn in sections:
        if args.only and name not in args.only:
            continue
        if time.time() - T0 > args.budget:
            print(f"# {name}: skipped (past the {args.budget:.0f} s budget)", flush=True)
            continue
        try:
            fn(rec, args.sweep, gpu, peer)
        except Exception as exc:  # keep going: one section failing must not lose the others
            import traceback
            traceback.print_exc()
            print(f"# {name}: FAILED {type(exc).__name__}: {exc}", flush=True)
        torch.cuda.empty_cache() if gpu else None
    import threading
    print(f"# Python threads at the end: {[th.name for th in threading.enumerate()]}")
    summary()


MODE = "both"


def t(fn, graph=False) -> float:
    """Median ms of fn (labkit.bench, cold L2 per sample as `labkit bench` does)."""
    if not labkit.current().is_gpu:
        return labkit.bench(fn, warmup_ms=1, rep_ms=2, min_reps=1).median_ms
    return labkit.bench(fn, warmup_ms=10, rep_ms=50, cuda_graph=graph).median_ms


def copy_gbps() -> float:
    src = torch.empty(2**28, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / t(lambda: dst.copy_(src)) / 1e6


def dims(gpu, full, small):
    return full if gpu else small


def err(out, ref) -> float:
    return float((out.detach().double() - ref.detach().double()).abs().max())


def randn(*shape, dtype):
    return torch.randn(*shape, device=labkit.current().device, dtype=torch.float32).to(dtype)


DT = {"fp32": torch.float32, "bf16": torch.bfloat16}


def sec_softmax(rec, sweep, gpu, peer):
    from labkit import kernels
    mod = sys.modules["labkit.kernels.softmax"]
    liger = peer("softmax")
    comp = torch.compile(lambda x: torch.softmax(x, -1)) if gpu and MODE != "no" else None
    shapes = dims(gpu, [(1024, 65536), (256, 131072), (65536, 1024), (4096, 16384), (256, 65536)], [(3, 300)])
    for M, N in shapes:
        for dn, dt in DT.items():
            x = randn(M, N, dtype=dt) * 4
            shape = f"{M}x{N}"
            nbytes = mod.min_bytes((M, N), dt)
            y = kernels.softmax(x)
            e = err(y, torch.softmax(x.double(), -1))
            assert e < (2e-6 if dt == torch.float32 else 8e-3), f"softmax {shape} {dn}: max error {e}"
            rec("softmax", shape, dn, "labkit", lambda: t(lambda: kernels.softmax(x)), nbytes, err=f"{e:.1e}",
                split=mod.use_split(M, N, dt, x.device))
            rec("softmax", shape, dn, "eager", lambda: t(lambda: torch.softmax(x, -1)), nbytes, ref=True)
            if comp:
                rec("softmax", shape, dn, "compile", lambda: t(lambda: comp(x)), nbytes, ref=True)
            if liger:
                rec("softmax", shape, dn, "liger", lambda: t(lambda: liger(x)), nbytes, ref=True)
            if sweep and N > 16384:
                old = (dict(mod.SPLIT_CHUNK), mod.SPLIT_WARPS)
                for chunk, warps in [(4096, 8), (8192, 8), (8192, 16), (16384, 16), (16384, 32)]:
                    if dt == torch.float32 and chunk > 16384:
                        continue
                    mod.SPLIT_CHUNK[dt], mod.SPLIT_WARPS = chunk, warps
                    rec("softmax", shape, dn, f"split c{chunk} w{warps}", lambda: t(lambda: kernels.softmax(x)), nbytes)
                mod.SPLIT_CHUNK.update(old[0])
                mod.SPLIT_WARPS = old[1]
                rec("softmax", shape, dn, "online (2 reads)", lambda: t(lambda: kernels.softmax(x, split=False)), nbytes)
            del x, y


def sec_layer_norm(rec, sweep, gpu, peer):
    from labkit import kernels
    mod = sys.modules["labkit.kernels.layer_norm"]
    from labkit.kernels.layer_norm import layer_norm_backward, layer_norm_forward
    liger = peer("layer_norm")
    ref = mod.reference
    comp = torch.compile(ref) if gpu and MODE != "no" else None
    if gpu:
        import torch._functorch.config as fc
        fc.donated_buffer = False
    shapes = dims(gpu, [(4096, 16384), (8192, 8192), (16384, 4096), (16384, 2048), (65536, 1024)], [(17, 129)])
    for M, N in shapes:
        for dn, dt in DT.items():
            shape = f"{M}x{N}"
            x = (randn(M, N, dtype=torch.float32) * 2 + 0.5).to(dt)
            w, b, dy = randn(N, dtype=dt), randn(N, dtype=dt), randn(M, N, dtype=dt)
            fb_bytes = mod.min_bytes((M, N), dt) + mod.min_bytes((M, N), dt, backward=True)
            # correctness at full size (fp64 reference of the same rounded inputs)
            xr, wr, br = (v.detach().clone().requires_grad_() for v in (x, w, b))
            y = kernels.layer_norm(xr, wr, br)
            gx, gw, gb = torch.autograd.grad(y, (xr, wr, br), dy)
            x64, w64, b64 = (v.detach().double().requires_grad_() for v in (x, w, b))
            y64 = ref(x64, w64, b64)
            g64 = torch.autograd.grad(y64, (x64, w64, b64), dy.double())
            errs = [err(a, r) / max(1e-30, float(r.abs().max())) for a, r in zip((y, gx, gw, gb), (y64, *g64))]
            lim = 1e-5 if dt == torch.float32 else 2e-2
            assert max(errs) < lim, f"layer_norm {shape} {dn}: relative errors {errs}"
            del xr, wr, br, y, gx, gw, gb, x64, w64, b64, y64, g64
            e = f"{max(errs):.1e}"
            # forward
            nb = mod.min_bytes((M, N), dt)
            rec("ln_fwd", shape, dn, "labkit", lambda: t(lambda: kernels.layer_norm(x, w, b)), nb, err=e,
                tile=mod._fwd_tile(N, dt))
            rec("ln_fwd", shape, dn, "eager", lambda: t(lambda: ref(x, w, b)), nb, ref=True)
            if comp:
                rec("ln_fwd", shape, dn, "compile", lambda: t(lambda: comp(x, w, b)), nb, ref=True)
            if liger:
                rec("ln_fwd", shape, dn, "liger", lambda: t(lambda: liger(x, w, b)), nb, ref=True)
            if sweep and dt == torch.bfloat16 and N >= 8192:
                old = mod.FWD_TILE[dt]
                for vpt in (16, 64):
                    mod.FWD_TILE[dt] = (old[0], vpt)
                    rec("ln_fwd", shape, dn, f"vpt{vpt} {mod._fwd_tile(N, dt)}", lambda: t(lambda: kernels.layer_norm(x, w, b)),
                        nb)
                mod.FWD_TILE[dt] = old
            # backward kernels alone, and forward + backward through autograd
            _, mean, rstd = layer_norm_forward(x, w, b)
            bb = mod.min_bytes((M, N), dt, backward=True)
            rec("ln_bwd", shape, dn, "labkit kernels", lambda: t(lambda: layer_norm_backward(dy, x, w, mean, rstd)), bb,
                tile=mod._bwd_tile(N, dt))
            xs, ws, bs = (v.detach().clone().requires_grad_() for v in (x, w, b))

            def fb(fn):
                return lambda: torch.autograd.grad(fn(xs, ws, bs), (xs, ws, bs), dy)
            rec("ln_fb", shape, dn, "labkit", lambda: t(fb(kernels.layer_norm)), fb_bytes)
            rec("ln_fb", shape, dn, "eager", lambda: t(fb(ref)), fb_bytes, ref=True)
            if comp:
                rec("ln_fb", shape, dn, "compile", lambda: t(fb(comp)), fb_bytes, ref=True)
            if liger:
                rec("ln_fb", shape, dn, "liger", lambda: t(fb(liger)), fb_bytes, ref=True)
            rec("ln_fb", shape, dn, "host labkit", lambda: host_ms(fb(kernels.layer_norm)))
            rec("ln_fb", shape, dn, "host eager", lambda: host_ms(fb(ref)))
            if sweep:
                olds = (dict(mod.BWD_VALUES_PER_THREAD), dict(mod.BWD_PROGRAMS_PER_SM))
                v0 = olds[0][dt]
                for vpt, ps in [((48 - v0[0], 48 - v0[1]), olds[1][dt]), (v0, (2, 2)), (v0, (1, 1))]:
                    mod.BWD_VALUES_PER_THREAD[dt], mod.BWD_PROGRAMS_PER_SM[dt] = vpt, ps
                    rec("ln_bwd", shape, dn, f"vpt{vpt[N > 4096]} p{ps[N > 4096]} {mod._bwd_tile(N, dt)}",
                        lambda: t(lambda: layer_norm_backward(dy, x, w, mean, rstd)), bb)
                mod.BWD_VALUES_PER_THREAD.update(olds[0])
                mod.BWD_PROGRAMS_PER_SM.update(olds[1])
            del x, w, b, dy, xs, ws, bs, mean, rstd


def sec_bias_gelu(rec, sweep, gpu, peer):
    from labkit import kernels
    mod = sys.modules["labkit.kernels.bias_gelu"]
    ref = mod.reference
    comp = torch.compile(ref) if gpu and MODE != "no" else None
    for M, N in dims(gpu, [(4096, 4096), (16384, 4096)], [(33, 129)]):
        for dn, dt in DT.items():
            shape = f"{M}x{N}"
            x, b, dy = randn(M, N, dtype=dt), randn(N, dtype=dt), randn(M, N, dtype=dt)
            xr, br = x.clone().requires_grad_(), b.clone().requires_grad_()
            y = kernels.bias_gelu(xr, br)
            gx, gb = torch.autograd.grad(y, (xr, br), dy)
            x64, b64 = x.double().requires_grad_(), b.double().requires_grad_()
            y64 = ref(x64, b64)
            g64 = torch.autograd.grad(y64, (x64, b64), dy.double())
            errs = [err(a, r) / max(1e-30, float(r.abs().max())) for a, r in zip((y, gx, gb), (y64, *g64))]
            assert max(errs) < (1e-5 if dt == torch.float32 else 2e-2), f"bias_gelu {shape} {dn}: {errs}"
            bb = mod.min_bytes((M, N), dt, backward=True)
            rec("gelu_bwd", shape, dn, "labkit kernel", lambda: t(lambda: mod.bias_gelu_backward(dy, x, b)), bb,
                err=f"{max(errs):.1e}")
            y = kernels.bias_gelu(xr, br)
            rec("gelu_bwd", shape, dn, "labkit autograd",
                lambda: t(lambda: torch.autograd.grad(y, (xr, br), dy, retain_graph=True)), bb)
            ye = ref(xr, br)
            rec("gelu_bwd", shape, dn, "host labkit autograd",
                lambda: host_ms(lambda: torch.autograd.grad(y, (xr, br), dy, retain_graph=True)))
            rec("gelu_bwd", shape, dn, "host labkit kernel", lambda: host_ms(lambda: mod.bias_gelu_backward(dy, x, b)))
            rec("gelu_bwd", shape, dn, "eager", lambda: t(lambda: torch.autograd.grad(ye, (xr, br), dy, retain_graph=True)),
                bb, ref=True)
            if comp:
                yc = comp(xr, br)
                rec("gelu_bwd", shape, dn, "compile",
                    lambda: t(lambda: torch.autograd.grad(yc, (xr, br), dy, retain_graph=True)), bb, ref=True)
            fb_ = mod.min_bytes((M, N), dt)
            rec("gelu_fwd", shape, dn, "labkit", lambda: t(lambda: mod.bias_gelu_forward(x, b)), fb_)
            rec("gelu_fwd", shape, dn, "eager", lambda: t(lambda: ref(x, b)), fb_, ref=True)
            if sweep:
                old = (mod.BWD_TILE, mod.BWD_PROGRAMS_PER_SM)
                for tile, ps in [((8192, 1024, 8), 8), ((2048, 1024, 4), 16), ((4096, 1024, 4), 8)]:
                    mod.BWD_TILE, mod.BWD_PROGRAMS_PER_SM = tile, ps
                    rec("gelu_bwd", shape, dn, f"tile{tile} p{ps}", lambda: t(lambda: mod.bias_gelu_backward(dy, x, b)), bb)
                mod.BWD_TILE, mod.BWD_PROGRAMS_PER_SM = old
            del x, b, dy, xr, br, y, gx, gb, x64, b64, y64, g64, ye


def sec_vector_add(rec, sweep, gpu, peer):
    from labkit import kernels
    mod = sys.modules["labkit.kernels.vector_add"]
    for n in dims(gpu, [2**20, 2**24], [4097]):
        for dn, dt in DT.items():
            x, y = randn(n, dtype=dt), randn(n, dtype=dt)
            e = err(kernels.vector_add(x, y), x.double() + y.double())
            assert e < (1e-6 if dt == torch.float32 else 2e-2) * 10, e
            nb = mod.min_bytes(n, dt)
            rec("vector_add", str(n), dn, "labkit (cached launch)", lambda: t(lambda: kernels.vector_add(x, y)), nb,
                err=f"{e:.1e}")
            z = torch.empty_like(x)
            grid = (triton_cdiv(n, mod.BLOCK),)
            rec("vector_add", str(n), dn, "triton kernel[grid] call",
                lambda: t(lambda: mod.vector_add_kernel[grid](x, y, z, n, BLOCK=mod.BLOCK, num_warps=8)), nb)
            rec("vector_add", str(n), dn, "eager", lambda: t(lambda: x + y), nb, ref=True)
            if gpu:
                rec("vector_add", str(n), dn, "labkit cuda graph", lambda: t(lambda: kernels.vector_add(x, y), graph=True), nb)
                rec("vector_add", str(n), dn, "eager cuda graph", lambda: t(lambda: x + y, graph=True), nb, ref=True)
                # host time per call, the GPU not waited for
                rec("vector_add", str(n), dn, "host labkit", lambda: host_ms(lambda: kernels.vector_add(x, y)))
                rec("vector_add", str(n), dn, "host triton kernel[grid]",
                    lambda: host_ms(lambda: mod.vector_add_kernel[grid](x, y, z, n, BLOCK=mod.BLOCK, num_warps=8)))
                rec("vector_add", str(n), dn, "host eager", lambda: host_ms(lambda: x + y))


def host_ms(fn, n=100) -> float:
    """Host milliseconds per call (the GPU not waited for), after a warm-up call."""
    fn()
    torch.cuda.synchronize() if labkit.current().is_gpu else None
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    ms = (time.perf_counter() - t0) / n * 1e3
    torch.cuda.synchronize() if labkit.current().is_gpu else None
    return ms


def triton_cdiv(a, b):
    return (a + b - 1) // b


def sec_matmul(rec, sweep, gpu, peer):
    from labkit import kernels
    from labkit.precision import tf32
    mod = sys.modules["labkit.kernels.matmul"]
    cases = dims(gpu, [(4096, "tf32"), (8192, "tf32"), (2048, "bf16"), (4096, "bf16")], [(64, "fp32")])
    for n, dn in cases:
        dt = torch.bfloat16 if dn == "bf16" else torch.float32
        with tf32(dn == "tf32"):
            a, b = randn(n, n, dtype=dt), randn(n, n, dtype=dt)
            fl = 2 * n ** 3
            c = kernels.matmul(a, b)
            ref = a.double() @ b.double()
            e = err(c, ref) / float(ref.abs().max())
            assert e < 1e-2, f"matmul {n} {dn}: relative error {e}"
            ms = t(lambda: kernels.matmul(a, b))
            best = mod.matmul_kernel.best_config
            ms_ref = t(lambda: torch.matmul(a, b))
            rec("matmul", str(n), dn, "labkit", ms, None, err=f"{e:.1e}", tflops=round(fl / ms / 1e9),
                vs_cublas=round(ms_ref / ms, 3), config=str(best))
            rec("matmul", str(n), dn, "cublas", ms_ref, None, ref=True, tflops=round(fl / ms_ref / 1e9))
            if sweep and dn == "tf32" and n == 4096:
                mod.TF32_B_K_MAJOR = False
                mod._tuned.clear()
                ms2 = t(lambda: kernels.matmul(a, b))
                rec("matmul", str(n), dn, "B row-major (no copy)", ms2, None, tflops=round(fl / ms2 / 1e9),
                    vs_cublas=round(ms_ref / ms2, 3), config=str(mod.matmul_kernel.best_config))
                mod.TF32_B_K_MAJOR = True
                bt = b.t().contiguous().t()
                ms3 = t(lambda: kernels.matmul(a, bt))
                rec("matmul", str(n), dn, "B already K-major", ms3, None, tflops=round(fl / ms3 / 1e9),
                    vs_cublas=round(ms_ref / ms3, 3))
            del a, b, c, ref


def sec_adam(rec, sweep, gpu, peer):
    from labkit.kernels.adam import TritonAdamW, min_bytes
    T, n = dims(gpu, (200, 2**20), (2, 500))
    for dn, dt in DT.items():
        def params():
            g = torch.Generator(device=labkit.current().device).manual_seed(0)
            ps = [torch.nn.Parameter(torch.randn(n, device=labkit.current().device, generator=g).to(dt))
                  for _ in range(T)]
            for p in ps:
                p.grad = torch.randn(n, device=labkit.current().device, generator=g).to(dt)
            return ps
        nb = min_bytes(T * n, dt, master_weights=False)
        ours, theirs = params(), params()
        opt = TritonAdamW(ours, master_weights=False)
        fused = torch.optim.AdamW(theirs, fused=True) if gpu else torch.optim.AdamW(theirs, foreach=False)
        for _ in range(3):
            opt.step()
            fused.step()
        e = max(err(p, q) for p, q in zip(ours, theirs))
        rec("adam", f"{T}x{n}", dn, "labkit (state in param dtype)", lambda: t(opt.step), nb, err=f"{e:.1e}")
        rec("adam", f"{T}x{n}", dn, "torch fused", lambda: t(fused.step), nb, ref=True)
        if dt != torch.float32:
            m = TritonAdamW(params(), master_weights=True)
            rec("adam", f"{T}x{n}", dn, "labkit fp32 master+state", lambda: t(m.step), min_bytes(T * n, dt))
        del ours, theirs, opt, fused


def summary() -> None:
    print("\n# summary: fraction of copy bandwidth (or TFLOP/s and vs cuBLAS); labkit vs each reference (ratio >1: "
          "labkit faster)")
    keyed: dict = {}
    for r in ROWS:
        keyed.setdefault((r["case"], r["shape"], r["dtype"]), []).append(r)
    for (case, shape, dtype), rs in keyed.items():
        mine = [r for r in rs if not r.get("ref") and not r["variant"].startswith("host")]
        if not mine:
            continue
        lab = mine[0]
        refs = " ".join(f"{r['variant']} {r['ms'] / lab['ms']:.2f}x" for r in rs if r.get("ref"))
        host = " ".join(f"{r['variant']} {r['ms'] * 1e3:.0f}us" for r in rs if r["variant"].startswith("host"))
        refs = f"{refs}  {host}" if host else refs
        best = min(mine, key=lambda r: r["ms"])
        fr = f"{lab['frac']:.0%}" if lab.get("frac") else (f"{lab.get('tflops')} TF/s" if lab.get("tflops") else "")
        bfr = f" best {best['variant']} {best['frac']:.0%}" if best is not lab and best.get("frac") else ""
        print(f"{case:<11} {shape:<12} {dtype:<5} {lab['ms'] * 1e3:9.1f} us {fr:>8}  {refs}{bfr}")


if __name__ == "__main__":
    main()
