"""Exercise 13 (the capstone): the grader times the student's training loop on its own seeds and scores
the speed-up, gives the released baseline its points, and zero to a loop that skips work, trains another
model, replays cached results or imports labkit's answer; the leaderboard ranks the class."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labkit.capstone import Trainer, variant
from labkit.exercises import ex13_capstone as ex13
from labkit.exercises import speed
from labkit.paths import child_env

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"
NB = "13_capstone"
TINY = {"model": {"seq": 16, "d_model": 32, "heads": 2, "layers": 1}, "batch": 4, "steps": 10, "windows": 16}


def src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def edit(notebook: dict, old: str, new: str) -> dict:
    notebook = json.loads(json.dumps(notebook))
    hits = [c for c in notebook["cells"] if c["cell_type"] == "code" and old in src(c)]
    assert len(hits) == 1, f"{old!r} found in {len(hits)} cells"
    hits[0]["source"] = src(hits[0]).replace(old, new)
    return notebook


def append(notebook: dict, code: str) -> dict:
    notebook = json.loads(json.dumps(notebook))
    notebook["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                              "source": code, "id": f"added{len(notebook['cells'])}"})
    return notebook


SOLUTION = json.loads((SOLUTIONS / f"{NB}.ipynb").read_text())
EXERCISE = json.loads((EXERCISES / f"{NB}.ipynb").read_text())
CHEATS = {
    # every other step runs the forward only: no backward, no update
    "skipper": edit(SOLUTION, "        loss.backward()\n        self.opt.step()\n",
                    "        if self.i % 2 == 0:\n            loss.backward()\n            self.opt.step()\n"),
    # the first block never trains
    "freezer": edit(SOLUTION, "        self.opt = torch.optim.AdamW(self.model.parameters(),",
                    "        self.model.blocks[0].requires_grad_(False)\n"
                    "        self.opt = torch.optim.AdamW(self.model.parameters(),"),
    # trains once, then hands back the stored losses and model: nothing computed in the timed rounds
    "cacher": append(SOLUTION, "_kept = {}\n\n\nclass Replay:\n    def __init__(self, t):\n"
                               "        self.model, self.kept = t.model, t.losses()\n\n    def step(self):\n"
                               "        pass\n\n    def losses(self):\n        return self.kept\n\n\n"
                               "def make_trainer(run, corpus, device):\n    if 'trainer' not in _kept:\n"
                               "        t = FastTrainer(run, corpus, device)\n        for _ in range(run.steps):\n"
                               "            t.step()\n        _kept['trainer'] = t\n"
                               "    return Replay(_kept['trainer'])\n"),
    # slows the grader's baseline down (a sleep in its step) to inflate the speed-up
    "slower": append(SOLUTION, "import time as _t\nfrom labkit.exercises import ex13_capstone as _ex13\n"
                               "_step = _ex13.BaselineTrainer.step\n\n\ndef _slow(self):\n    _t.sleep(0.02)\n"
                               "    _step(self)\n\n\n_ex13.BaselineTrainer.step = _slow\n"),
    # the untouched baseline, with two processes forked through libc (no audit event) that burn the cores whenever
    # its own loop is not running: they slowed the grader's baseline when it ran in the student's process (2 of 4
    # points, 1.78x, on this 2-core machine), and are stopped with every other process of the student's now
    "forker": append(EXERCISE, "import ctypes as _ct, mmap as _mm, time as _time\n"
                               "_flag = _mm.mmap(-1, 1)\n_make = make_trainer\n\n\n"
                               "class _Wrap:\n    def __init__(self, t):\n        self.t, self.model = t, t.model\n\n"
                               "    def step(self):\n        self.t.step()\n\n    def losses(self):\n"
                               "        _flag[0] = 0\n        return self.t.losses()\n\n\n"
                               "def make_trainer(run, corpus, device):\n    _flag[0] = 1\n"
                               "    return _Wrap(_make(run, corpus, device))\n\n\n"
                               "for _ in range(2):\n    if _ct.CDLL(None).fork() == 0:\n        while True:\n"
                               "            if _flag[0]:\n                _time.sleep(0.0005)\n"
                               "            else:\n                sum(range(100000))\n"),
    # writes a reply of its own on the pipe where the grader reads each round's result
    "scribbler": append(SOLUTION, "import json as _json, os as _os, sys as _sys\n"
                                  "_fd = _json.load(open(_os.path.join(_sys.argv[1], 'job.json')))['reply_fd']\n"
                                  "_os.write(_fd, (64).to_bytes(8, 'little') + b'\\xff' * 64)\n"),
    # notebook 13's answer, imported
    "importer": append(SOLUTION, "from labkit.capstone import Trainer, variant\n\n\n"
                                 "def make_trainer(run, corpus, device):\n"
                                 "    return Trainer(variant('device_data'), run, corpus, device)\n"),
}


def test_the_baseline_trainer_is_notebook_13s_baseline():
    run, corpus, held = ex13.workload(TINY, 3)
    a = ex13.one_round(ex13.BaselineTrainer, run, corpus, held, torch.device("cpu"))
    b = ex13.one_round(lambda r, c, d: Trainer(variant("baseline"), r, c, d), run, corpus, held, torch.device("cpu"))
    assert a["losses"] == b["losses"] and torch.equal(a["logits"], b["logits"])


def test_scores_follow_the_thresholds_and_a_wrong_round_scores_zero():
    case = ex13.capstone_case("tiny", TINY, [1, 2, 3, 4], "cpu")
    exp = case["expected"]
    got = {"rounds": [{"losses": r["losses"], "logits": r["logits"]} for r in exp["rounds"]],
           "seconds": [1.0] * 4, "baseline seconds": [1.0] * 4}
    slowest_base = ex13.BASELINE_SLACK * exp["measured"]["baseline seconds"]
    got["baseline seconds"] = [min(1.0, slowest_base)] * 4
    for speedup, points in ((1.0, 0), (1.3, 1), (1.9, 2), (2.5, 3), (10.0, 4), (0.5, 0)):  # (none on an edge)
        frac, notes, details = ex13.score_capstone(exp, dict(got, seconds=[got["baseline seconds"][0] / speedup] * 4))
        assert frac * ex13.MAX_POINTS == points, notes
        assert details["speedup"] == pytest.approx(speedup)
    wrong = json.loads(json.dumps({k: v for k, v in got.items() if k != "rounds"}))
    wrong["rounds"] = [dict(r) for r in got["rounds"]]
    wrong["rounds"][2] = wrong["rounds"][1]  # another seed's losses and trained model, replayed
    frac, notes, _ = ex13.score_capstone(exp, dict(wrong, seconds=[1e-3] * 4))
    assert frac == 0 and "timed round 2" in notes[0]


def test_on_a_gpu_one_far_round_is_forgiven_but_a_loop_off_in_most_rounds_scores_zero():
    exp = ex13.capstone_case("tiny", TINY, [1, 2, 3, 4], "cpu")["expected"]
    # on a GPU training does not repeat: the median of the rounds decides
    t = exp["measured"]["baseline seconds"]

    def graded(scale: list[float], rtol=ex13.RTOL["cuda"]):
        rounds = [{"losses": [x * f for x in r["losses"]], "logits": r["logits"]} for r, f in zip(exp["rounds"], scale)]
        return ex13.score_capstone(dict(exp, rtol=rtol),
                                   {"rounds": rounds, "seconds": [t / 2] * 4, "baseline seconds": [t] * 4})

    frac, notes, _ = graded([1.0, 1.15, 1.0, 1.0])  # one seed 15% off: within a round's bound, the median is on
    assert frac > 0, notes
    frac, notes, _ = graded([1.1] * 4)  # every seed 10% off: each round within its bound, the median is not
    assert frac == 0 and "a median 10.0% off" in notes[0], notes
    frac, notes, _ = graded([1.0, 1.0, 1.5, 1.0])  # one seed 50% off: over any round's bound
    assert frac == 0 and "timed round 2" in notes[0], notes
    frac, notes, _ = graded([1.0, 1.05, 1.0, 1.0], ex13.RTOL["cpu"])  # a CPU repeats: every round must be on
    assert frac == 0 and "timed round 1" in notes[0], notes


def test_a_baseline_slowed_down_in_the_students_process_does_not_inflate_the_speedup():
    case = ex13.capstone_case("tiny", TINY, [1, 2, 3, 4], "cpu")
    exp = case["expected"]
    rounds = [{"losses": r["losses"], "logits": r["logits"]} for r in exp["rounds"]]
    t = exp["measured"]["baseline seconds"]
    _, notes, details = ex13.score_capstone(exp, {"rounds": rounds, "seconds": [t] * 4,
                                                  "baseline seconds": [100 * t] * 4})
    assert details["speedup"] == pytest.approx(ex13.BASELINE_SLACK)
    assert "slower while your notebook was timed" in notes[0]


def test_identical_work_gets_identical_points_in_noisy_gradings_and_the_stub_none():
    """score_capstone on controlled timings: the right model every round, paired times drawn with load noise (jitter,
    a neighbour's bursts on one side of a pair); the child's rounds stop as speed.paired_rounds says."""
    import random

    case = ex13.capstone_case("tiny", TINY, list(range(1, ex13.MAX_ROUNDS + 2)), "cpu")
    exp, args = case["expected"], case["args"]
    t = exp["measured"]["baseline seconds"]

    def graded(true: float, seed: int) -> tuple[float, dict]:
        rng = random.Random(seed)

        def pair(i: int, base_first: bool) -> tuple[float, float]:
            b, m = t * rng.lognormvariate(0, 0.04), t / true * rng.lognormvariate(0, 0.04)
            if rng.random() < 0.15:
                b, m = (1.5 * b, m) if rng.random() < 0.5 else (b, 1.5 * m)
            return b, m

        pairs = speed.paired_rounds(pair, args["thresholds"], args["min rounds"], len(args["seeds"]) - 1)
        rounds = [{"losses": r["losses"], "logits": r["logits"]} for r in exp["rounds"][:len(pairs)]]
        frac, notes, details = ex13.score_capstone(exp, {"rounds": rounds, "seconds": [m for _, m in pairs],
                                                         "baseline seconds": [b for b, _ in pairs]})
        return frac * ex13.MAX_POINTS, details

    for true, points in ((1.0, 0), (1.45, 1), (2.0, 2)):
        got = {graded(true, seed)[0] for seed in range(20)}
        assert got == {points}, (true, got)
    _, details = graded(1.45, 0)
    assert details["speedup"] <= 1.45 * 1.1  # the lower bound, what the points are for, is on the leaderboard


def test_rounds_stopped_early_or_run_past_the_budget_earn_nothing_extra():
    case = ex13.capstone_case("tiny", TINY, list(range(1, 5)), "cpu")
    exp = case["expected"]
    rounds = [{"losses": r["losses"], "logits": r["logits"]} for r in exp["rounds"]]
    t = exp["measured"]["baseline seconds"]
    frac, notes, _ = ex13.score_capstone(exp, {"rounds": rounds[:2], "seconds": [t / 9] * 2,
                                               "baseline seconds": [t] * 2})
    assert frac == 0 and "2 rounds measured, for 4 to 4" in notes[0]
    frac, notes, _ = ex13.score_capstone(exp, {"rounds": rounds * 2, "seconds": [t / 9] * 8,
                                               "baseline seconds": [t] * 8})
    assert frac == 0 and "8 rounds measured" in notes[0]


@pytest.fixture(scope="module")
def graded(tmp_path_factory, grader_sandbox_flags):
    base = tmp_path_factory.mktemp("capstone")
    subs, out = base / "subs", base / "out"
    notebooks = {"solution": SOLUTION, "exercise": EXERCISE, **CHEATS}
    for student, content in notebooks.items():
        (subs / student).mkdir(parents=True)
        (subs / student / f"{NB}.ipynb").write_text(json.dumps(content))
    (subs / "someone_else").mkdir()  # submitted another exercise only: not on the leaderboard
    (subs / "someone_else" / "12_serving.ipynb").write_text((SOLUTIONS / "12_serving.ipynb").read_text())
    board = base / "class" / "board.csv"
    board.parent.mkdir()
    cmd = [sys.executable, "-m", "labkit.cli", "grade", str(subs), "--out", str(out), "--only", NB, "--workers", "2",
           "--share-cores", "--timeout", "120", "--exercise-timeout", "60", "--device", "cpu",
           "--leaderboard", str(board)]
    cmd += grader_sandbox_flags
    run = subprocess.run(cmd, cwd=ROOT, env=child_env(ROOT), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(out / "grades.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    with open(out / "leaderboard.csv", newline="") as f:
        leaderboard = list(csv.DictReader(f))
    feedback = {p.stem: p.read_text() for p in (out / "feedback").glob("*.md")}
    return rows, feedback, leaderboard, board.read_text()


def points_for_reported(speedup: str) -> set[float]:
    """The make_trainer points (of the graded file's 4) the CPU thresholds give a speed-up as leaderboard.csv
    reports it (6 significant digits: two values only when it rounds onto a threshold)."""
    sp = float(speedup)
    return {speed.points_for(sp * f, ex13.THRESHOLDS["cpu"]) * 4 / ex13.MAX_POINTS for f in (1 - 1e-5, 1 + 1e-5)}


def test_the_solution_and_the_released_baseline_score_the_points_of_the_speed_up_they_reach(graded):
    """Both train the baseline's model, so both are scored by speed: the lower bound of the speed-up's interval
    (leaderboard.csv's `speedup`) gets the thresholds' points, and the untouched baseline none."""
    rows, feedback, leaderboard, _ = graded
    board = {r["student"]: r for r in leaderboard}
    for student in ("solution", "exercise"):
        r, fb = board[student], feedback[student]
        assert r["rank"] and not r["note"] and float(r["speedup"]) > 0, fb  # right results: ranked, not zeroed
        assert float(rows[student]["make_trainer"]) in points_for_reported(r["speedup"]), (r["speedup"], fb)
        assert r["points"] == rows[student]["make_trainer"] and r["out_of"] == "4"
        assert "tokens/s" in fb and "x the baseline" in fb and "paired rounds" in fb
    assert rows["exercise"]["make_trainer"] == "0", feedback["exercise"]


def test_points_for_reported_applies_the_thresholds():
    assert points_for_reported("1.19") == {1.0} and points_for_reported("0.69") == {0.0}
    assert points_for_reported("1.01") == {0.0} and points_for_reported("9.5") == {4.0}
    assert points_for_reported("1.75") == {1.0, 2.0}  # on a threshold, as printed: either side


@pytest.mark.parametrize("student, why", [("skipper", "loss"), ("freezer", "must train the same model"),
                                          ("cacher", "fresh seed"), ("slower", "rebound the grader's"),
                                          ("importer", "asks you to write"), ("forker", "earns 0 of 4 points"),
                                          ("scribbler", "only the grader replies there")])
def test_skipping_work_caching_and_importing_the_answer_score_zero(graded, student, why):
    rows, feedback, _, _ = graded
    assert rows[student]["make_trainer"] == "0", feedback[student]
    assert why in feedback[student], feedback[student]


def test_the_leaderboard_ranks_by_speedup_and_lists_wrong_results_last(graded):
    rows, _, leaderboard, copy = graded
    assert [r["student"] for r in leaderboard][:2] and {r["student"] for r in leaderboard} == set(rows) - {
        "someone_else"}
    ranked = [r for r in leaderboard if r["rank"]]
    assert {r["student"] for r in ranked} == {"solution", "exercise", "forker"}  # the right model, however slow
    assert [float(r["speedup"]) for r in ranked] == sorted((float(r["speedup"]) for r in ranked), reverse=True)
    assert all(float(r["tokens_per_s"]) > 0 and 1 < float(r["loss"]) < 5 for r in ranked)
    assert {r["points"] for r in ranked} == {rows[r["student"]]["make_trainer"] for r in ranked}
    zero = [r for r in leaderboard if not r["rank"]]
    assert all(r["points"] == "0" and r["note"] for r in zero) and leaderboard[-len(zero):] == zero
    assert copy.splitlines()[0].startswith("rank,student")


def test_a_leaderboard_file_inside_the_submissions_is_refused(tmp_path):
    subs = tmp_path / "subs"
    (subs / "a").mkdir(parents=True)
    (subs / "a" / f"{NB}.ipynb").write_text(json.dumps(SOLUTION))
    before = (subs / "a" / f"{NB}.ipynb").read_text()
    run = subprocess.run([sys.executable, "-m", "labkit.cli", "grade", str(subs), "--out", str(tmp_path / "out"),
                          "--leaderboard", str(subs / "a" / f"{NB}.ipynb"), "--device", "cpu"], cwd=ROOT,
                         env=child_env(ROOT), capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "never overwritten" in run.stderr
    assert (subs / "a" / f"{NB}.ipynb").read_text() == before


def test_merging_shards_ranks_their_leaderboards_as_one_class(tmp_path):
    from labkit.grading import merge
    from labkit.grading.report import LEADERBOARD

    def shard(k: int, students: dict[str, str]) -> Path:
        d = tmp_path / f"shard{k}"
        (d / "feedback").mkdir(parents=True)
        (d / "grades.csv").write_text("student,submission,make_trainer,total,out_of,notes\n"
                                      + "".join(f"{s},{s},1,1,4,\n" for s in students))
        for s in students:
            (d / "feedback" / f"{s}.md").write_text(f"# {s}\n")
        (d / "shard.json").write_text(json.dumps({"shard": k, "of": 2, "roster": "r", "roster_size": 3, "seed": 1,
                                                  "students": list(students), "columns": ["make_trainer"]}))
        with open(d / "leaderboard.csv", "w", newline="") as f:
            w = csv.DictWriter(f, LEADERBOARD)
            w.writeheader()
            for rank, (s, sp) in enumerate(students.items(), 1):
                w.writerow({"rank": rank if sp else "", "student": s, "submission": s, "function": "make_trainer",
                            "speedup": sp, "tokens_per_s": "1" if sp else "", "loss": "2" if sp else "",
                            "points": "1" if sp else "0", "out_of": "4", "note": "" if sp else "wrong loss"})
        return d

    assert merge.merge([shard(1, {"ann": "1.2", "cid": ""}), shard(2, {"bo": "3.5"})], tmp_path / "all") == 3
    with open(tmp_path / "all" / "leaderboard.csv", newline="") as f:
        board = [(r["rank"], r["student"]) for r in csv.DictReader(f)]
    assert board == [("1", "bo"), ("2", "ann"), ("", "cid")]


class _SleepyTrainer(ex13.BaselineTrainer):
    """The baseline's loop, idle 20 ms a step: wall time that is no CPU time (as a loaded machine's is)."""

    def step(self):
        import time
        time.sleep(0.02)
        return super().step()


def test_the_preview_counts_cpu_time_on_a_cpu_as_the_grader_does(monkeypatch):
    # The notebook's preview times a CPU round on this process's CPU time (and its children's), as the grader's
    # rounds do, so load on the machine does not move it: an idle step costs nothing.
    sizes = ex13.SIZES["cpu"]
    run, corpus, held = ex13.workload(sizes, 1)
    with ex13.threads(1):  # as the rounds run on a CPU (idle worker threads would spin: CPU time)
        wall = ex13.one_round(_SleepyTrainer, run, corpus, held, torch.device("cpu"))["seconds"]
        cpu = ex13.one_round(_SleepyTrainer, run, corpus, held, torch.device("cpu"), ex13._CPU_CLOCK)["seconds"]
    idle = 0.02 * run.steps
    assert wall >= idle and cpu < wall - 0.8 * idle
    clocks = []
    monkeypatch.setattr(ex13, "one_round", lambda *a: clocks.append(a[5]) or {"seconds": 1.0, "losses": [],
                                                                             "logits": torch.zeros(1)})
    monkeypatch.setattr(ex13.speed, "paired_rounds", lambda pair, *a: [pair(0, True)])
    got = ex13.call_make_trainer(_SleepyTrainer, {"device": "cpu", "seeds": [1, 2], "sizes": sizes,
                                                  "thresholds": [], "min rounds": 1})
    assert clocks == [ex13._CPU_CLOCK] * 2 and got["clock"] == "cpu"
