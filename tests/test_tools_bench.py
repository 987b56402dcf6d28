"""`labkit bench`: every kernel module offers its cases; bench loops over them and keeps its output format.

Times mean nothing here (the Triton interpreter on tiny sizes): these tests check what bench runs
and writes, never how fast.
"""
import csv
import json
import types

import pytest
import torch

from labkit import kernels
from labkit.tools import bench
from labkit.kernels._bench import BenchCase, Timed

CSV_HEAD = ["kernel", "shape", "dtype", "ms", "spread", "rate", "unit", "ceiling", "fraction"]


def test_every_benchmarked_module_offers_well_formed_cases():
    names = []
    for module in kernels.BENCHMARKED.values():
        cases = module.bench_cases()
        assert cases, module.__name__
        for case in cases:
            assert isinstance(case, BenchCase) and case.unit in ("GB/s", "TFLOP/s")
            assert case.cpu_sizes and case.gpu_sizes and set(case.gpu_dtypes) <= set(bench.DTYPES)
            for size in case.cpu_sizes + case.gpu_sizes:
                bench.parse_shape(size)
            names.append(case.name)
    assert len(names) == len(set(names))
    assert {"vector_add", "bias_gelu_bwd", "softmax", "layer_norm_bwd", "adam", "matmul"} <= set(names)


def test_bench_runs_two_kernels_and_saves_the_same_columns(tmp_path, capsys):
    assert bench.main(["vector_add", "matmul", "--sizes", "33", "--save", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "vector_add  (rate from the minimum bytes/FLOPs" in out and "vs torch" in out
    with open(tmp_path / "b.csv", newline="") as f:
        rows = list(csv.reader(f))
    kernels_run = [r[0] for r in rows[1:]]  # one row per dtype: one each on a CPU, several on a GPU
    assert rows[0][:9] == CSV_HEAD and kernels_run == sorted(kernels_run, key=["vector_add", "matmul"].index)
    assert set(kernels_run) == {"vector_add", "matmul"}
    matmul_rows = [r for r in rows[1:] if r[0] == "matmul"]
    assert all(r[1] == "33x33x33" and r[6] == "TFLOP/s" for r in matmul_rows)
    saved = json.loads((tmp_path / "b.json").read_text())
    assert set(saved) == {"machine", "peers", "ceilings", "timing", "rows", "long_process"}
    assert saved["timing"] == "events"
    assert list(saved["rows"][0]["baseline_ms"]) == ["eager", "compile"]
    assert saved["ceilings"]["copy_gbps"] > 0 and saved["machine"]["torch"] == torch.__version__


def test_peers_are_absent_without_a_gpu_and_their_column_is_dropped(monkeypatch, capsys):
    from labkit import device
    from labkit.kernels import _bench
    softmax = kernels.modules()["softmax"]
    with monkeypatch.context() as m:
        m.setattr(device, "current", lambda: types.SimpleNamespace(is_gpu=False))
        assert _bench.peer("softmax") is None  # a CPU has no production kernel to compare with
    monkeypatch.setattr(softmax, "peer", lambda name, source="liger": None)  # a GPU host without the peers
    assert bench.main(["softmax", "--sizes", "5x33"]) == 0
    out = capsys.readouterr().out
    assert "vs eager" in out and "vs liger" not in out


def test_a_size_a_kernel_cannot_take_is_skipped_with_its_reason(capsys):
    # Layer norm takes rows of at most 16384: one line says so, and the next kernel still runs.
    assert bench.main(["layer_norm", "vector_add", "--sizes", "16385"]) == 0
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert "layer_norm 16385 fp32: skipped: layer_norm: rows of 16385 elements are longer" in said
    assert "Traceback" not in said
    assert "layer_norm: no size ran" in captured.out and "vector_add  (rate" in captured.out


def test_a_modules_name_runs_every_case_it_offers_even_one_of_the_same_name(tmp_path):
    # `labkit bench bias_gelu` is the forward and the backward (a case is named like its module), each once
    assert bench.main(["bias_gelu", "--sizes", "3x17", "--save", str(tmp_path / "b")]) == 0
    assert bench.main(["bias_gelu", "bias_gelu_bwd", "--sizes", "3x17", "--save", str(tmp_path / "c")]) == 0
    with open(tmp_path / "c.csv", newline="") as f:
        assert [r[0] for r in list(csv.reader(f))[1:]] == ["bias_gelu", "bias_gelu_bwd"]
    with open(tmp_path / "b.csv", newline="") as f:
        assert [r[0] for r in list(csv.reader(f))[1:]] == ["bias_gelu", "bias_gelu_bwd"]


def test_a_new_kernel_module_is_one_entry_in_the_table(monkeypatch, capsys):
    def make(dims, dtype, use_compile):
        x = torch.randn(*dims, dtype=dtype)
        return Timed("x".join(map(str, dims)), lambda: x * 2, {"eager": lambda: x + x, "compile": None},
                     2 * x.numel() * dtype.itemsize)

    toy = types.ModuleType("labkit.kernels.toy_double")
    toy.bench_cases = lambda: [BenchCase("toy_double", make, ("64",), ("5x7",))]
    monkeypatch.setattr(kernels, "BENCHMARKED", {**kernels.BENCHMARKED, "toy_double": toy})
    assert bench.main(["toy_double"]) == 0
    assert "toy_double" in capsys.readouterr().out


def test_unknown_kernels_are_named_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        bench.main(["no_such_kernel"])
    assert "choose from vector_add" in capsys.readouterr().err


def test_cuda_graph_timing_needs_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the GPU test below covers --cuda-graph")
    with pytest.raises(SystemExit):
        bench.main(["vector_add", "--cuda-graph"])
    assert "--cuda-graph needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_timing_captures_backward_and_forward_backward_rows(tmp_path, capsys):
    # The backward rows build their forward on the first call, on the stream the graph is captured on.
    assert bench.main(["bias_gelu_bwd", "layer_norm_fb", "--sizes", "1024x1024", "--dtypes", "bf16",
                           "--no-compile", "--cuda-graph", "--save", str(tmp_path / "g")]) == 0
    assert "timing: cuda-graph" in capsys.readouterr().out
    saved = json.loads((tmp_path / "g.json").read_text())
    assert saved["timing"] == "cuda-graph" and len(saved["rows"]) == 2
    assert all(r["ms"] > 0 and r["baseline_ms"]["eager"] > 0 for r in saved["rows"])


def test_grad_fn_builds_its_forward_once_on_the_first_call():
    from labkit.kernels._bench import grad_fn
    calls = []
    x = torch.randn(5, requires_grad=True)

    def f(t):
        calls.append(1)
        return t * 3
    backward = grad_fn(f, (x,), torch.ones(5))
    assert calls == []
    for _ in range(3):
        (g,) = backward()
        assert torch.equal(g, torch.full((5,), 3.0))
    assert calls == [1]


def test_host_time_columns_and_the_long_process_check(tmp_path, capsys):
    # Each row carries labkit's host time per call and eager's; --long-process times the first case again last.
    args = ["softmax", "vector_add", "--sizes", "3x17", "--long-process", "--save", str(tmp_path / "b")]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "host us" in out and "eager host us" in out
    assert "long process: softmax 3x17 fp32, fresh vs after all the others" in out
    saved = json.loads((tmp_path / "b.json").read_text())
    soft = [r for r in saved["rows"] if r["kernel"] == "softmax"][0]
    assert soft["host_us"] > 0 and soft["baseline_host_us"]["eager"] > 0
    fresh, later = saved["long_process"]
    assert (fresh["when"], later["when"]) == ("fresh", "after all others")
    assert fresh["kernel"] == later["kernel"] == "softmax" and fresh["shape"] == later["shape"] == "3x17"


def test_long_process_table_gives_each_ratio():
    def entry(ms, host, eager_ms, eager_host):
        return {"kernel": "layer_norm", "shape": "8x8", "dtype": "bf16", "ms": ms, "host_us": host,
                "baseline_ms": {"eager": eager_ms, "liger": None}, "baseline_host_us": {"eager": eager_host}}
    text = bench.long_process_table([entry(0.1, 100.0, 0.2, 50.0), entry(0.25, 300.0, 0.2, 50.0)])
    lines = {line.split()[0] + (" host" if "host" in line else ""): line for line in text.splitlines()[2:]}
    assert lines["labkit"].endswith("2.50x") and lines["labkit host"].endswith("3.00x")
    assert lines["eager"].endswith("1.00x") and lines["eager host"].endswith("1.00x")
    assert "liger" not in text  # a peer without both times has no line


def test_table_shows_host_us_beside_eager_and_na_where_unmeasured():
    case = BenchCase("k", lambda *a: None, ("8",), ("8",))
    rows = [bench.Row("k", "8", "fp32", 0.01, 0.0, 1.0, "GB/s", 2.0, 0.5, {"eager": 0.02, "compile": None},
                      {"eager": 2.0, "compile": None}, 12.5, {"eager": 7.25}),
            bench.Row("k", "16", "fp32", 0.01, 0.0, 1.0, "GB/s", 2.0, 0.5, {"eager": 0.02, "compile": None},
                      {"eager": 2.0, "compile": None})]
    head, first, second = bench.table(case, rows).splitlines()[1:]
    assert head.split()[-6:] == ["eager", "host", "us", "eager", "host", "us"]  # "vs eager", "host us", "eager host us"
    assert first.split()[-2:] == ["12.5", "7.2"] and second.split()[-2:] == ["n/a", "n/a"]


def test_quack_and_liger_peers_are_none_without_a_gpu(monkeypatch):
    from labkit import device
    from labkit.kernels import _bench
    monkeypatch.setattr(device, "current", lambda: types.SimpleNamespace(is_gpu=False))
    assert _bench.peer("softmax", "quack") is None and _bench.peer("layer_norm", "liger") is None


def test_host_times_of_a_row_are_interleaved_so_a_drift_of_the_host_falls_on_each_alike(monkeypatch):
    # A host that slows down while the row is measured (each call costs more than the one before): two calls of
    # equal cost must come out within 10% of each other. Measured one after the other, the second looks 1.2x slower.
    clock, issued = [0.0], [0]

    def call():
        issued[0] += 1
        clock[0] += 1e-6 * (1 + issued[0] / 200)

    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench.compat, "gpu_sleep", lambda: (lambda cycles: None))
    got = bench.host_us_paired({"labkit": call, "eager": lambda: call()}, quick_cpu=False)
    assert set(got) == {"labkit", "eager"}
    assert got["labkit"] == pytest.approx(got["eager"], rel=0.1)
    alone = [bench.host_us_paired({"call": call}, quick_cpu=False)["call"] for _ in range(2)]  # one after the other
    assert alone[1] > 1.15 * alone[0]


def test_backward_rows_show_the_autograd_floor_beside_labkit_and_eager(tmp_path, capsys):
    # The floor is a Function that launches nothing: it returns gradients of the inputs' shapes, and its host time
    # is reported beside labkit's and eager's.
    from labkit.kernels._bench import autograd_floor
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    grads = autograd_floor((x, w), torch.ones(4, 8))()
    assert [g.shape for g in grads] == [x.shape, w.shape]
    grads = autograd_floor((x, w), torch.ones(4, 8), backward_only=True)()
    assert [g.shape for g in grads] == [x.shape, w.shape]
    assert bench.main(["layer_norm_fb", "--sizes", "3x17", "--save", str(tmp_path / "b")]) == 0
    assert "floor host us" in capsys.readouterr().out
    row = json.loads((tmp_path / "b.json").read_text())["rows"][0]
    assert row["baseline_host_us"]["floor"] > 0 and row["baseline_host_us"]["eager"] > 0
