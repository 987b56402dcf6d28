"""labkit.parallel.fsdp: FSDP2 and ZeRO-1 over 2 gloo ranks equal DDP; bytes held and sent match the ZeRO formulas."""
import pytest

from labkit.parallel import fsdp, launch


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return launch.torchrun("labkit.parallel.fsdp", 2, ["--dim", "6", "--blocks", "2", "--global-batch", "6",
                           "--steps", "3", "--mp", "--iters", "1", "--repeats", "1", "--lr", "0.01", "--seed", "4"],
                           backend="gloo", device="cpu", out=tmp_path_factory.mktemp("fsdp") / "r.json", echo=False)


def test_sharded_training_equals_ddp(run):
    runs = run["runs"]
    ddp = runs["DDP"]["losses"]
    assert ddp[0] != ddp[-1], "DDP did not train: the comparison would be vacuous"
    for kind in ("ZeRO-1", "FSDP"):
        assert runs[kind]["param_diff_vs_ddp"] <= 1e-6 * run["param_max_abs"], kind
        assert runs[kind]["loss_diff_vs_ddp"] <= 1e-6 * max(ddp), kind
    assert runs["FSDP bf16"]["loss_diff_vs_ddp"] <= 2e-2 * max(ddp)   # bf16 compute: close, not equal


def test_bytes_held_per_rank_match_the_formulas(run):
    f, n = run["formula_fp32"], run["param_count"]
    assert n == 2 * (2 * 6 * 24 + 24 + 6)
    for rank in run["runs"]["DDP"]["held_per_rank"]:
        assert rank == f["DDP"]
    for rank in run["runs"]["FSDP"]["held_per_rank"]:
        assert rank == f["ZeRO-3"]   # every parameter's size is even: the shards need no padding
    z1 = run["runs"]["ZeRO-1"]["held_per_rank"]
    assert all(r["params"] == f["DDP"]["params"] and r["grads"] == f["DDP"]["grads"] for r in z1)
    assert sum(r["optimizer"] for r in z1) == f["DDP"]["optimizer"]   # the state is split, whole parameters per rank
    assert all(r["optimizer"] < f["DDP"]["optimizer"] for r in z1)


def test_collective_traffic_is_counted(run):
    n, runs = run["param_count"], run["runs"]
    assert runs["DDP"]["traffic"]["all_reduce_bytes"] == 4 * n
    t = runs["FSDP"]["traffic"]
    assert t["all_gather"] == 2 * 2 and t["reduce_scatter"] == 2   # per block: gather in forward and backward
    assert t["all_gather_bytes"] == 2 * 4 * n and t["reduce_scatter_bytes"] == 4 * n
    assert runs["FSDP bf16"]["traffic"]["all_gather_bytes"] == 2 * 2 * n   # bf16 parameters: half the bytes


def test_step_times_are_samples(run):
    for kind, r in run["runs"].items():
        assert len(r["step_samples_ms"]) == 1 and r["step_ms"] == r["step_samples_ms"][0] > 0, kind
        assert r["step_p20_ms"] == r["step_ms"] == r["step_p80_ms"], kind


def test_zero_formula():
    z = fsdp.zero_bytes(1000, 4)
    assert z["DDP"]["total"] == 16_000 and z["ZeRO-3"]["total"] == 4_000
    assert z["ZeRO-1"]["total"] == 2000 + 2000 + 3000 and z["ZeRO-2"]["total"] == 2000 + 500 + 3000
    assert fsdp.zero_bytes(10, 1)["ZeRO-3"] == fsdp.zero_bytes(10, 1)["DDP"]


def test_uneven_batch_and_bad_arguments_are_refused():
    with pytest.raises(SystemExit, match="multiple of 4"):
        fsdp.body(fsdp.parse_args(["--out", "x", "--global-batch", "6"]), launch.Ctx(0, 4, None, "gloo"))
    with pytest.raises(SystemExit):
        fsdp.parse_args(["--out", "x", "--blocks", "0"])
