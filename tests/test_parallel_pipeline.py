"""labkit.parallel.pipeline: schedules as a model, and 2 (and 4) gloo stages equal to one process."""
import subprocess

import pytest
import torch

from labkit.parallel import launch
from labkit.parallel import pipeline as P



@pytest.mark.parametrize("p,m", [(2, 1), (2, 3), (3, 5), (4, 8), (4, 2)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_simulated_bubble_is_the_formula(schedule, p, m):
    events = P.simulate(p, m, schedule)
    assert len(events) == 2 * p * m
    for idle in P.bubble(events)["per_stage"]:
        assert idle == pytest.approx(P.bubble_formula(p, m))
    assert P.bubble(events)["makespan"] == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 2), (5, 3)])
def test_orders_and_activations_in_flight(p, m):
    for s in range(p):
        for schedule, held in (("gpipe", m), ("1f1b", min(p - s, m))):
            steps = P.ORDERS[schedule](s, p, m)
            P.check_order(steps, m)
            assert P.in_flight(steps) == held, (schedule, s)


def test_bad_orders_are_refused():
    with pytest.raises(ValueError, match="before"):
        P.check_order([("B", 0), ("F", 0)], 1)
    with pytest.raises(ValueError, match="once"):
        P.check_order([("F", 0), ("B", 0), ("B", 0)], 1)
    with pytest.raises(ValueError, match="in turn"):
        P.check_order([("F", 1), ("F", 0), ("B", 0), ("B", 1)], 2)
    # stage 0 backwards before stage 1 has any forward to backward from: every stage waits
    with pytest.raises(ValueError, match="deadlock"):
        P.simulate(2, 2, order=lambda s, p, m: [("F", 0), ("B", 0), ("F", 1), ("B", 1)] if s == 0
                   else [("F", 0), ("F", 1), ("B", 1), ("B", 0)])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_emulated_pipeline_equals_one_process(schedule):
    import torch
    import torch.nn.functional as F

    p, m, layers, dim = 3, 4, 2, 6
    torch.manual_seed(1)
    model = P.make_model(p, layers, dim)
    x, y = P.data(m * 3, dim, 1)
    ref = F.mse_loss(model(x), y)
    ref.backward()
    want = [q.grad.clone() for q in model.parameters()]
    model.zero_grad(set_to_none=True)
    loss = P.emulate([P.ORDERS[schedule](s, p, m) for s in range(p)], [P.stage_of(model, s, layers) for s in range(p)],
                     list(x.chunk(m)), list(y.chunk(m)))
    assert loss == pytest.approx(float(ref.detach()), rel=1e-6)
    for got, exp in zip(model.parameters(), want):
        assert torch.allclose(got.grad, exp, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="once"):
        P.emulate([[("F", 0), ("B", 0)]] * p, [P.stage_of(model, s, layers) for s in range(p)], list(x.chunk(m)),
                  list(y.chunk(m)))


def test_naive_two_devices_leaves_each_idle_half_the_time():
    r = P.naive_two_devices(("cpu", "cpu"), dim=32, layers=1, batch=8, steps=2)
    ev = sorted(r["events"], key=lambda e: e["start"])
    assert [(e["stage"], e["op"]) for e in ev] == [(0, "F"), (1, "F"), (1, "B"), (0, "B")]
    for a, b in zip(ev, ev[1:]):
        assert a["end"] <= b["start"]   # one device at a time
    assert r["mean"] >= 0.5 - 1e-9
    assert "unsynced" not in r   # one device: nothing could overlap, so nothing to time without synchronising


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_naive_two_gpus_unsynced_step_times_each_half_on_its_gpu():
    r = P.naive_two_devices(("cuda:0", "cuda:1"), dim=256, layers=2, batch=512, steps=3)
    u = r["unsynced"]
    assert len(u["step_s"]) == 10 and [len(b) for b in u["busy_s"]] == [10, 10]
    for wall, a, b in zip(u["step_s"], *u["busy_s"]):
        assert 0 < a and 0 < b and a + b <= wall * 1.05   # the halves take turns


@pytest.fixture(scope="module")
def two_stages(tmp_path_factory):
    return launch.torchrun("labkit.parallel.pipeline", 2, ["--dim", "12", "--layers", "2", "--micro-batch", "3",
                           "--ms", "1,4", "--stage-ms", "10", "--repeats", "3", "--check-m", "3", "--check-dim", "9",
                           "--seed", "2"],
                           backend="gloo", device="cpu", out=tmp_path_factory.mktemp("pp") / "r.json", echo=False)


def test_gradients_equal_one_process(two_stages):
    chk = two_stages["check"]
    assert chk["grad_max_abs"] > 0
    for schedule in ("gpipe", "1f1b"):
        assert chk[schedule]["grad_rel_diff"] <= 1e-5, schedule
        assert chk[schedule]["loss_diff"] <= 1e-6 * chk["ref_loss"], schedule


def test_each_stage_runs_its_schedule_whose_bubble_is_the_formula(two_stages):
    """What the processes did, not how fast: how close the measured idle share comes to the formula on this
    machine is notebook 10's claim (bubble_matches_formula) and `labkit bench`'s, not a unit test's."""
    rows = two_stages["sweep"]
    assert [(r["schedule"], r["m"]) for r in rows] == [("gpipe", 1), ("gpipe", 4), ("1f1b", 1), ("1f1b", 4)]
    for r in rows:
        assert r["formula"] == pytest.approx(1 / (r["m"] + 1))
        # the reported bubble is the median repeat's, and that is the run whose events are reported
        assert len(r["bubbles"]) == 3 and r["bubble"] == sorted(r["bubbles"])[1]
        measured = P.bubble(r["events"])
        assert r["bubble"] == pytest.approx(measured["mean"]) and r["per_stage_bubble"] == pytest.approx(
            measured["per_stage"]) and r["makespan_s"] == pytest.approx(measured["makespan"])
        # each stage ran its schedule's steps in its schedule's order, each padded to its cost (10 ms, backward 20)
        done = [[(e["op"], e["mb"]) for e in sorted(r["events"], key=lambda e: e["start"]) if e["stage"] == s]
                for s in range(2)]
        assert done == [P.ORDERS[r["schedule"]](s, 2, r["m"]) for s in range(2)], r["schedule"]
        assert all(e["end"] - e["start"] >= (0.010 if e["op"] == "F" else 0.020) - 1e-6 for e in r["events"])
        # and that order, at equal costs, idles each stage exactly the formula's share
        ideal = P.bubble(P.simulate(2, r["m"], order=lambda s, p, m, done=done: done[s]))["per_stage"]
        assert ideal == pytest.approx([r["formula"]] * 2)


def test_timeline_respects_dependencies_and_memory_follows_the_schedule(two_stages):
    for r in two_stages["sweep"]:
        ev = {(e["stage"], e["op"], e["mb"]): e for e in r["events"]}
        assert len(ev) == 2 * 2 * r["m"]
        for i in range(r["m"]):
            assert ev[(1, "F", i)]["start"] >= ev[(0, "F", i)]["end"]   # one clock on one host
            assert ev[(0, "B", i)]["start"] >= ev[(1, "B", i)]["end"]
        held = [r["m"], r["m"]] if r["schedule"] == "gpipe" else [min(2, r["m"]), 1]
        assert r["in_flight"] == held
        assert r["peak_saved_bytes"] == [h * b for h, b in zip(held, r["per_mb_bytes"])]
        # what one micro-batch keeps (fp32, 3 rows of 12): stage 0 the two GELUs' inputs, the second Linear's
        # input and its output (not the input data); stage 1 also its received input, what the loss saves of its
        # input (not the target) and the loss itself
        assert r["per_mb_bytes"] == [4 * 3 * 12 * 4, 5 * 3 * 12 * 4 + 4]


def test_replay_plays_the_measured_durations():
    ev = P.simulate(3, 5, "gpipe", f=1.0, b=2.5)
    again = P.replay(ev, 3, 5, "gpipe")
    def key(e):
        return e["stage"], e["op"], e["mb"]

    assert sorted(again, key=key) == sorted(ev, key=key)
    slow = [{**e, "end": e["end"] + 1.0} if key(e) == (1, "F", 0) else e for e in ev]   # one step took longer
    assert P.bubble(P.replay(slow, 3, 5, "gpipe"))["makespan"] == pytest.approx(P.bubble(ev)["makespan"] + 1.0)


def test_compute_free_runs_measure_the_pipelines_own_cost(two_stages):
    for r in two_stages["sweep"]:
        # the same steps with no transfer and no wait: never longer than what was measured
        assert r["replay_makespan_s"] <= r["makespan_s"] + 1e-9
        assert r["busy_mean_s"] == pytest.approx(r["busy_per_mb_s"] * r["m"])
        assert len(r["overhead_makespans_s"]) == 3 and all(v > 0 for v in r["overhead_makespans_s"])
        assert min(r["overhead_makespans_s"]) < r["makespan_s"] / 2   # no compute, no padding
        # a stage's forward and backward of one micro-batch: padded to 10 + 20 ms
        assert 0.030 - 1e-6 <= r["busy_per_mb_s"] < 0.030 + 0.010


def test_four_stages(tmp_path):
    r = launch.torchrun("labkit.parallel.pipeline", 4, ["--dim", "8", "--layers", "1", "--micro-batch", "2",
                        "--ms", "4", "--stage-ms", "4", "--repeats", "1", "--warmup", "0", "--check-m", "4"],
                        backend="gloo", device="cpu", out=tmp_path / "r.json", echo=False)
    for schedule in ("gpipe", "1f1b"):
        assert r["check"][schedule]["grad_rel_diff"] <= 1e-5
    assert [row["in_flight"] for row in r["sweep"]] == [[4, 4, 4, 4], [4, 3, 2, 1]]


def test_without_torchrun_or_with_one_stage_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="torch.distributed.run"):
        P.main(["--out", str(tmp_path / "r.json")])
    with pytest.raises(SystemExit, match="at least 2 stages"):
        P.body(P.parse_args(["--out", "x"]), launch.Ctx(0, 1, None, "gloo"))


def test_fewer_gpus_than_processes_is_a_clear_message(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(P.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(P.torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit, match="one GPU per process"):
        launch.start(P.parse_args(["--out", "x", "--device", "cuda"]), P.PROG)


@pytest.mark.parametrize("bad", [["--ms", "0"], ["--ms", "a"], ["--schedules", "zb"], ["--stage-ms", "-1"]])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(SystemExit):
        P.parse_args(["--out", "x", *bad])


def test_launcher_reports_a_failing_child(monkeypatch, tmp_path):
    seen = {}

    def fake_run(cmd, env, timeout):
        seen.update(cmd=cmd, env=env)
        return True, subprocess.CompletedProcess(cmd, 1, "",
                                                 "labkit.parallel.pipeline: a pipeline needs at least 2 stages\n")

    monkeypatch.setattr(launch, "run_bounded", fake_run)
    with pytest.raises(RuntimeError, match="at least 2 stages"):
        launch.torchrun("labkit.parallel.pipeline", 1, ["--ms", "2"], backend="gloo", device="cpu",
                        out=tmp_path / "r.json", echo=False)
    assert seen["cmd"][seen["cmd"].index("--nproc_per_node") + 1] == "1" and "--standalone" in seen["cmd"]
    assert seen["env"]["NCCL_NVLS_ENABLE"] == "0" and "--master_port" not in seen["cmd"]
    with pytest.raises(ValueError):
        launch.torchrun("labkit.parallel.pipeline", 0, [])


def test_a_hung_run_is_stopped_with_every_ranks_stack_and_leaves_no_process(tmp_path, monkeypatch):
    """A rank stuck in a collective (here: asleep) must not hang the notebook or keep holding a device."""
    (tmp_path / "labkit_sleeper_rank.py").write_text("import time\n\ntime.sleep(600)  # the stuck rank\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="did not finish in 20 s") as err:
        launch.torchrun("labkit_sleeper_rank", 2, [], timeout=20, echo=False)
    assert "time.sleep(600)" in str(err.value) or "labkit_sleeper_rank.py" in str(err.value), str(err.value)[-2000:]
    left = subprocess.run(["pgrep", "-f", "labkit_sleeper_rank"], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes left running: {left.stdout}"
