"""labkit.parallel.ddp: DDP over 2 gloo processes equals one process on the global batch; helpers fail clearly."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labkit.parallel import ddp, ddp_timing, launch
from labkit.paths import child_env

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """One torchrun launch of 2 gloo CPU processes with tiny sizes (a few seconds, mostly start-up)."""
    out = tmp_path_factory.mktemp("ddp") / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "labkit.parallel.ddp", "--out", str(out), "--backend", "gloo", "--device", "cpu",
           "--dim", "7", "--hidden", "19", "--layers", "3", "--global-batch", "10", "--check-steps", "3",
           "--batch-per-rank", "6", "--steps", "3", "--warmup", "1", "--bucket-cap-mb", "0.001",
           "--allreduce-bytes", "4096,65536", "--allreduce-iters", "2", "--allreduce-warmup", "1",
           "--allreduce-repeats", "3", "--accum-steps", "3", "--bucket-sweep", "0.001,1",
           "--trace", str(out.parent / "trace.json"), "--seed", "3"]
    env = child_env(ROOT, OMP_NUM_THREADS="1", NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(out.read_text())


def test_parameters_identical_across_ranks(two_process_run):
    chk = two_process_run["check"]
    assert two_process_run["world_size"] == 2 and two_process_run["backend"] == "gloo"
    assert len(chk["rank_checksums"]) == 2
    assert chk["checksum_spread"] == 0.0
    assert chk["max_param_diff_across_ranks"] == 0.0
    assert two_process_run["throughput"]["checksum_spread"] == 0.0


def test_loss_and_parameters_match_one_process_on_the_global_batch(two_process_run):
    chk = two_process_run["check"]
    ddp, ref = chk["ddp_losses"], chk["ref_losses"]
    assert len(ddp) == len(ref) == 3
    assert all(math.isfinite(v) and v > 0 for v in ddp + ref)
    assert ref[0] != ref[-1], "the reference did not train: the comparison would be vacuous"
    for a, b in zip(ddp, ref):
        assert abs(a - b) <= 1e-5 * abs(b), (ddp, ref)
    assert chk["max_loss_diff"] <= 1e-5 * max(ref)
    assert chk["max_param_diff_vs_ref"] <= 1e-5


def test_accumulated_gradient_equals_ddp_gradient(two_process_run):
    chk = two_process_run["check"]
    scale = chk["grad_max_abs"]
    assert scale > 0
    for key in ("grad_diff_ddp_vs_full", "grad_diff_accum_vs_full", "grad_diff_ddp_vs_accum"):
        assert chk[key] <= 1e-5 * scale, (key, chk[key], scale)


def test_buckets_cover_every_parameter(two_process_run):
    chk = two_process_run["check"]
    # a 7-19-19-7 MLP: 6 tensors; a 1 kB bucket cap splits them into several buckets
    assert sum(b["params"] for b in chk["buckets"]) == 6
    assert len(chk["buckets"]) >= 2
    assert sum(b["bytes"] for b in chk["buckets"]) == 4 * chk["param_count"]


def test_throughput_and_allreduce_fields(two_process_run):
    thr = two_process_run["throughput"]
    for key in ("samples_per_s", "single_samples_per_s", "scaling_efficiency", "ddp_grad_ms", "accum_grad_ms",
                "backward_ms"):
        assert math.isfinite(thr[key]) and thr[key] > 0, key
    assert thr["grad_bytes"] == 4 * two_process_run["check"]["param_count"]
    rows = two_process_run["allreduce"]
    assert [r["bytes"] for r in rows] == [4096, 65536]
    for r in rows:
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (2 - 1) / 2)
        assert len(r["samples_us"]) == 3 and min(r["samples_us"]) <= r["us"] <= max(r["samples_us"])
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["us"] * 1e-6) / 1e9)
        assert r["p20_us"] <= r["us"] <= r["p80_us"]


def test_step_parts_are_samples_per_step(two_process_run):
    """The DDP step and its parts, each one sample per timed step, their medians reported; buckets as DDP made them."""
    thr = two_process_run["throughput"]
    for part in ("step", "step_one", "compute", "backward", "comm", "comm_one", "together", "single"):
        xs = thr[f"{part}_samples_ms"]
        assert len(xs) == 3 and all(math.isfinite(v) and v > 0 for v in xs), part
    for part in ("step", "step_one", "compute", "backward", "comm", "comm_one", "together"):
        assert thr[f"{part}_ms"] == pytest.approx(sorted(thr[f"{part}_samples_ms"])[1]), part
    assert thr["single_step_ms"] == pytest.approx(sorted(thr["single_samples_ms"])[1])
    assert thr["scaling_efficiency"] == pytest.approx(thr["single_step_ms"] / thr["step_ms"])
    # a 1 kB cap: each tensor of the 7-19-19-7 MLP is over it, so DDP regroups them into several buckets
    assert len(thr["bucket_bytes"]) >= 2 and sum(thr["bucket_bytes"]) == thr["grad_bytes"]
    assert thr["one_bucket_bytes"] == [thr["grad_bytes"]]  # the one-bucket DDP's cap holds every gradient
    assert two_process_run["threads"] == launch.default_threads(2) and two_process_run["cores"] >= 1


def test_bucket_comm_fn_averages_like_ddp(monkeypatch):
    """Alone (one rank), the communication copies each bucket in, divides by the ranks, and copies it back."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        start, finish = ddp_timing.bucket_comm_fn([40, 12], 1, torch.device("cpu"))
        works = start()
        assert len(works) == 2
        finish(works)
    finally:
        dist.destroy_process_group()


def test_default_threads_leave_a_core_for_communication():
    assert launch.default_threads(2, cores=16) == 7
    assert launch.default_threads(2, cores=2) == 1
    assert launch.default_threads(4, cores=2) == 1


def test_no_sync_accumulation_equals_the_whole_batch_with_one_round_of_all_reduces(two_process_run):
    chk = two_process_run["check"]
    assert chk["grad_diff_nosync_vs_full"] <= 1e-5 * chk["grad_max_abs"]
    # the 3 micro-batches per rank communicate once: as many bucket all-reduces as one backward
    assert chk["nosync_allreduce_calls"] == chk["nosync_buckets_per_backward"] >= 1   # not 3 rounds


def test_bucket_sweep_and_trace(two_process_run, tmp_path_factory):
    rows = two_process_run["bucket_sweep"]
    assert [r["bucket_cap_mb"] for r in rows] == [0.001, 1.0]
    assert all(0 < r["p20_ms"] <= r["step_ms"] <= r["p80_ms"] for r in rows)
    assert all(len(r["samples_ms"]) == 3 for r in rows)
    assert len(rows[0]["bucket_bytes"]) >= 2 and len(rows[1]["bucket_bytes"]) == 1   # 1 MB holds every gradient
    tr = two_process_run["trace"]
    assert tr["allreduce"] and tr["compute"], tr
    for a, b in tr["allreduce"] + tr["compute"]:
        assert 0 <= a <= b
    assert len(tr["leads_ms"]) == 12 and tr["bucket_bytes"] == two_process_run["throughput"]["bucket_bytes"]
    busy = tr["compute_busy_ms"]   # the compute's own time in each profiled step, with and without communication
    assert set(busy) == {"ddp", "no_sync"} and all(len(v) == 12 and min(v) > 0 for v in busy.values()), busy


def test_intervals_classify_gpu_kernels_and_cpu_ops():
    from types import SimpleNamespace as E

    def ev(name, start, end, dev="DeviceType.CPU"):
        return E(name=name, time_range=E(start=start, end=end), device_type=dev)

    events = [ev("step 0", 0, 50), ev("step 1", 100, 200),
              ev("autograd::engine::evaluate_function: MmBackward0", 110, 130),
              ev("gloo:all_reduce", 125, 180), ev("c10d::allreduce_", 124, 126), ev("aten::add", 140, 141),
              ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 150, 190, "DeviceType.CUDA"),
              ev("sm90_xmma_gemm", 120, 140, "DeviceType.CUDA"), ev("sm90_xmma_gemm", 10, 20, "DeviceType.CUDA")]
    cpu = ddp_timing.intervals(events, "cpu")
    assert cpu == {"compute": [[10, 30]], "allreduce": [[25, 80]]}
    gpu = ddp_timing.intervals(events, "cuda")
    assert gpu == {"compute": [[20, 40]], "allreduce": [[50, 90]]}
    assert ddp_timing.intervals(events, "cpu", which=0) == {"compute": [], "allreduce": []}   # step 0 saw neither
    assert ddp_timing.intervals(events, "cuda", which=0) == {"compute": [[10, 20]], "allreduce": []}
    assert ddp_timing.intervals([], "cpu") == {"compute": [], "allreduce": []}


def test_choose_backend_and_device():
    assert launch.choose("auto", "auto", 2, 0) == ("gloo", "cpu")
    assert launch.choose("auto", "auto", 2, 2) == ("nccl", "cuda")
    assert launch.choose("auto", "auto", 4, 2) == ("gloo", "cpu")
    assert launch.choose("gloo", "auto", 2, 2) == ("gloo", "cpu")
    assert launch.choose("gloo", "cuda", 2, 2) == ("gloo", "cuda")
    with pytest.raises(ValueError, match="use --backend gloo"):
        launch.choose("nccl", "cpu", 2, 0)
    with pytest.raises(ValueError, match="one GPU per process"):
        launch.choose("auto", "cuda", 4, 2)


def test_main_without_torchrun_says_how_to_launch(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert ddp.main(["--out", str(tmp_path / "r.json")]) == 2
    assert "torch.distributed.run" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("bad", [["--layers", "1"], ["--steps", "0"], ["--global-batch", "0"],
                                 ["--allreduce-repeats", "0"], ["--accum-steps", "0"]])
def test_bad_arguments_are_refused(bad, tmp_path):
    with pytest.raises(SystemExit):
        ddp.parse_args(["--out", str(tmp_path / "r.json"), *bad])


def test_global_batch_is_deterministic_and_changes_per_step():
    x0, y0 = ddp.global_batch(0, 5, 3, seed=1)
    x0b, y0b = ddp.global_batch(0, 5, 3, seed=1)
    x1, _ = ddp.global_batch(1, 5, 3, seed=1)
    assert torch.equal(x0, x0b) and torch.equal(y0, y0b)
    assert not torch.equal(x0, x1)
    assert x0.shape == (5, 3) and y0.shape == (5, 3)


def test_checksum_sees_any_change():
    torch.manual_seed(0)
    m = ddp.make_model(5, 9, 3)
    before = ddp.checksum(m)
    with torch.no_grad():
        m[2].weight[3, 4] += 1e-6
    assert ddp.checksum(m) != before


def test_one_process_run_in_this_process(monkeypatch, tmp_path):
    """World size 1 (what `--nproc_per_node 1` gives): DDP equals the plain model; no all-reduce sweep."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    threads = torch.get_num_threads()
    out = tmp_path / "one.json"
    try:
        rc = ddp.main(["--out", str(out), "--backend", "gloo", "--device", "cpu", "--dim", "5",
                             "--hidden", "11", "--global-batch", "7", "--check-steps", "2", "--batch-per-rank", "5",
                             "--steps", "2", "--warmup", "1", "--allreduce-bytes", "4096", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["world_size"] == 1 and res["allreduce"] == []
    chk = res["check"]
    assert chk["max_param_diff_across_ranks"] == 0.0
    assert chk["max_loss_diff"] <= 1e-6 * max(chk["ref_losses"])
    assert chk["grad_diff_ddp_vs_full"] <= 1e-6 * chk["grad_max_abs"]
    assert res["throughput"]["scaling_efficiency"] > 0
