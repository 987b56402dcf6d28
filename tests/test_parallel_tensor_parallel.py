"""labkit.parallel.tensor_parallel: the column/row split over 2 gloo ranks equals one process, one all-reduce
each way."""
import pytest

from labkit.parallel import launch
from labkit.parallel import tensor_parallel as T

DIM, HIDDEN, TOKENS = 10, 24, 7


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return launch.torchrun("labkit.parallel.tensor_parallel", 2,
                           ["--dim", DIM, "--hidden", HIDDEN, "--tokens", TOKENS, "--dims", "8,16", "--iters", "2",
                            "--repeats", "2", "--seed", "5"],
                           backend="gloo", device="cpu", out=tmp_path_factory.mktemp("tp") / "r.json", echo=False)


@pytest.mark.parametrize("kind", ["hand", "dtensor"])
def test_outputs_and_gradients_equal_one_process(run, kind):
    chk = run["check"]
    r = chk[kind]
    assert chk["out_max_abs"] > 0 and chk["grad_max_abs"] > 0 and chk["x_grad_max_abs"] > 0
    assert r["out_diff"] <= 1e-5 * chk["out_max_abs"]
    assert r["grad_diff"] <= 1e-5 * chk["grad_max_abs"]
    assert r["x_grad_diff"] <= 1e-5 * chk["x_grad_max_abs"]
    assert chk["worst_over_ranks"][f"{kind}_out"] <= 1e-5 * chk["out_max_abs"]
    assert chk["worst_over_ranks"][f"{kind}_grad"] <= 1e-5 * chk["grad_max_abs"]


def test_each_rank_holds_its_share_of_the_weights(run):
    shard = (DIM * HIDDEN + HIDDEN) // 2 + DIM * HIDDEN // 2 + DIM   # up rows + bias slice, down columns + whole bias
    assert run["check"]["hand"]["local_params"] == run["check"]["dtensor"]["local_params"] == shard
    assert run["check"]["full_params"] == 2 * DIM * HIDDEN + HIDDEN + DIM


def test_one_all_reduce_forward_and_one_backward(run):
    hand, dt = run["check"]["hand"], run["check"]["dtensor"]
    assert hand["forward_all_reduces"] == hand["backward_all_reduces"] == 1
    assert hand["forward_bytes"] == hand["backward_bytes"] == TOKENS * DIM * 4
    assert sum(dt["forward_comms"].values()) == sum(dt["backward_comms"].values()) == 1
    assert all("all_reduce" in k for k in list(dt["forward_comms"]) + list(dt["backward_comms"]))


def test_sweep_fields(run):
    rows = run["sweep"]
    assert [r["dim"] for r in rows] == [8, 16]
    for r in rows:
        assert r["tp_p20_ms"] <= r["tp_step_ms"] <= r["tp_p80_ms"]
        for key in ("tp_samples_ms", "all_reduce_samples_ms", "full_samples_ms"):   # one sample per repeat
            assert len(r[key]) == 2 and all(v > 0 for v in r[key]), key
        assert r["tp_step_ms"] == pytest.approx(sum(r["tp_samples_ms"]) / 2)   # the median of two
        assert r["comm_ms"] == pytest.approx(2 * r["all_reduce_ms"]) and 0 < r["comm_fraction"] <= 1
        assert r["bytes_per_step"] == 2 * TOKENS * r["dim"] * 4
        assert r["ring_bytes_per_rank"] == pytest.approx(r["bytes_per_step"])   # 2 (t-1)/t = 1 for t = 2


def test_uneven_split_and_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="multiple of 4"):
        T.TensorParallelMLP(T.MLP(4, 6), 0, 4)
    with pytest.raises(SystemExit, match="split evenly"):
        T.body(T.parse_args(["--out", "x", "--hidden", "5"]), launch.Ctx(0, 2, None, "gloo"))
    for bad in (["--dims", "8,x"], ["--tokens", "0"]):
        with pytest.raises(SystemExit):
            T.parse_args(["--out", "x", *bad])
