"""Hostile submissions against what judges a timed exercise (labkit.exercises.integrity): rebinding the grader's
timers or baseline, slowing the baseline through hooks, tracers, anomaly mode or a thread, leaving a torch mode on.
None may gain a point: the timed call is refused, or the baseline runs as it would have without the notebook."""
import csv
import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from labkit.exercises import ex11_profiling as ex11
from labkit.exercises import ex13_capstone as ex13
from labkit.exercises import integrity
from labkit.grading.cli import GradeConfig, grade

ROOT = Path(__file__).resolve().parent.parent

TINY = {"model": {"seq": 16, "d_model": 32, "heads": 2, "layers": 1}, "batch": 4, "steps": 10, "windows": 16}


@pytest.fixture
def captured():
    """As in the grading child: the judging code and process state captured before 'student code' (the test)."""
    integrity.capture()
    yield
    for store in (integrity._pinned, integrity._clean, integrity._threads):
        store.clear()


def args(seeds: int = 3) -> dict:
    return ex13.capstone_case("tiny", TINY, list(range(1, seeds + 1)), "cpu")["args"]


def honest(run, corpus, device):
    return ex13.BaselineTrainer(run, corpus, device)


def slower(fn):
    def slow(*args, **kwargs):
        time.sleep(1e-3)
        return fn(*args, **kwargs)
    return slow


def rebinds(target, attr: str, value):
    def make(run, corpus, device):
        setattr(target, attr, value)
        return honest(run, corpus, device)
    return make


@pytest.mark.parametrize("make", [
    rebinds(ex13, "_CLOCK", lambda: 0.0),  # the grader's clock
    rebinds(ex13, "workload", lambda sizes, seed: None),  # the baseline's workload
    rebinds(ex13.BaselineTrainer, "step", slower(ex13.BaselineTrainer.step)),  # the baseline itself
    rebinds(F, "cross_entropy", slower(F.cross_entropy)),  # a torch function the baseline calls
    rebinds(torch.Tensor, "item", slower(torch.Tensor.item)),
], ids=["clock", "workload", "baseline", "torch function", "tensor method"])
def test_rebinding_what_judges_refuses_the_timed_call(make, captured, monkeypatch):
    for target, attr in ((ex13, "_CLOCK"), (ex13, "workload"), (ex13.BaselineTrainer, "step"), (F, "cross_entropy"),
                         (torch.Tensor, "item")):
        monkeypatch.setattr(target, attr, getattr(target, attr))  # restored after the test, whatever it rebinds
    with pytest.raises(integrity.Tampered, match="rebound the grader's"):
        ex13.call_make_trainer(make, args())


def test_a_thread_left_running_refuses_the_timed_call(captured):
    stop = threading.Event()

    def make(run, corpus, device):
        threading.Thread(target=lambda: stop.wait(30) or None, name="burner", daemon=True).start()
        return honest(run, corpus, device)

    try:
        with pytest.raises(integrity.Tampered, match="threads it started were running \\(burner"):
            ex13.call_make_trainer(make, args())
    finally:
        stop.set()


def test_a_torch_mode_left_on_refuses_the_timed_call(captured):
    class Passthrough(torch.overrides.TorchFunctionMode):  # could slow, count or record whatever runs under it
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    mode = Passthrough()

    def make(run, corpus, device):
        mode.__enter__()
        return honest(run, corpus, device)

    try:
        with pytest.raises(integrity.Tampered, match="mode it entered was still on"):
            ex13.call_make_trainer(make, args())
    finally:
        mode.__exit__(None, None, None)


def test_state_left_on_never_reaches_the_baseline(captured):
    """A global forward hook that would slow every module, a profiler function, anomaly mode: all on for the
    submission's rounds, none while the baseline's run (the hook never sees the baseline's model)."""
    seen, mine = {"mine": 0, "base": 0}, set()

    def hook(module, inputs, output):
        seen["mine" if id(module) in mine else "base"] += 1

    def make(run, corpus, device):
        t = honest(run, corpus, device)
        mine.update(id(m) for m in t.model.modules())
        return t

    case = args()  # (the parent's baseline run, before the notebook's hook)
    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    profiler = lambda *a: None  # noqa: E731
    sys.setprofile(profiler)
    torch.autograd.set_detect_anomaly(True)
    try:
        with integrity.clean():
            assert not torch.is_anomaly_enabled() and sys.getprofile() is None
            assert not torch.nn.modules.module._global_forward_hooks
        assert torch.is_anomaly_enabled() and sys.getprofile() is profiler  # the notebook's state, back
        sys.setprofile(None)  # (it would slow the submission's own rounds tenfold)
        got = ex13.call_make_trainer(make, case)
    finally:
        sys.setprofile(None)
        torch.autograd.set_detect_anomaly(False)
        handle.remove()
    assert seen["mine"] > 0 and seen["base"] == 0, seen
    assert len(got["seconds"]) == len(got["baseline seconds"]) == 3


def test_the_slow_side_of_exercise_11_runs_clean_and_its_helpers_are_held(captured, monkeypatch):
    case = ex11.visible_fast_train()[0]
    case["args"]["seeds"] = case["args"]["seeds"][:3]
    case["args"]["min runs"] = 3
    monkeypatch.setattr(ex11, "_CLOCK", ex11._CLOCK)

    def cheat(*a, **k):
        ex11._CLOCK = lambda: 0.0  # every later time zero
        return ex11.slow_train(*a, **k)

    with pytest.raises(integrity.Tampered, match="ex11_profiling._CLOCK"):
        ex11.call_fast_train(cheat, case["args"])


def test_outside_the_grading_child_nothing_is_enforced():
    assert not integrity._clean and integrity.threads() is None
    integrity.check("in a notebook's preview")  # no capture: no refusal


def test_an_honest_compile_and_a_progress_bar_are_not_tampering(captured):
    """torch.compile patches nn.Module.__init__/__setstate__ once and tqdm starts a monitor thread: an honest
    notebook does both (seen on a GPU grading the capstone's solution), and neither may refuse its timed call."""
    import tqdm

    lin = torch.nn.Linear(4, 4)
    compiled = torch.compile(lin, backend="eager")
    assert torch.allclose(compiled(torch.ones(2, 4)), lin(torch.ones(2, 4)))
    for _ in tqdm.tqdm(range(3)):
        pass
    integrity.check("after a timed round")  # raises Tampered on a rebound judge or a stray thread


def test_rebinding_module_init_after_compile_is_still_tampering(captured):
    """The honest patch is applied before the judge is pinned; rebinding it afterwards is still caught."""
    init = torch.nn.Module.__init__
    try:
        torch.nn.Module.__init__ = lambda self, *a, **k: init(self, *a, **k)
        with pytest.raises(integrity.Tampered, match="Module.__init__"):
            integrity.check("after a timed round")
    finally:
        torch.nn.Module.__init__ = init


# exercise 05's launch check judges in the student's process (labkit.exercises.launches): rebinding its helpers,
# in a cell or during the call, would make the library's sum pass as the notebook's kernel
REBIND = "import labkit.exercises.launches as L\nL.touched = lambda *a, **k: True\nL.produced = lambda *a, **k: True\n"
HOSTILE_05 = {
    "rebinder": REBIND + "def row_sum(x):\n    return x.float().sum(1)\n",
    "midcall": "def row_sum(x):\n" + "".join(f"    {line}\n" for line in REBIND.splitlines())
               + "    return x.float().sum(1)\n",
}


def test_rebinding_the_launch_observer_scores_zero_on_row_sum(tmp_path, grader_sandbox_flags):
    subs = tmp_path / "subs"
    for who, extra in {"honest": None, **HOSTILE_05}.items():
        nb = json.loads((ROOT / "solutions" / "05_triton_row_sum.ipynb").read_text())
        if extra:  # after the solution's cells: its @triton.jit kernel is still there, never launched
            nb["cells"].append({"cell_type": "code", "id": "hostile", "metadata": {}, "outputs": [],
                                "execution_count": None, "source": extra})
        (subs / who).mkdir(parents=True)
        (subs / who / "05_triton_row_sum.ipynb").write_text(json.dumps(nb))
    grade(GradeConfig(subs, tmp_path / "out", device="cpu", only=["05_triton_row_sum"], timeout=120, workers=2,
                      memo="off", unsafe_no_sandbox=bool(grader_sandbox_flags)))
    with open(tmp_path / "out" / "grades.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert float(rows["honest"]["row_sum"]) == 2, rows["honest"]
    for who in HOSTILE_05:
        assert float(rows[who]["row_sum"]) == 0, rows[who]
        assert "rebound the grader's labkit.exercises.launches." in (tmp_path / "out" / "feedback" /
                                                                     f"{who}.md").read_text()
