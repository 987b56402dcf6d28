"""labkit.grading.memo: identical code graded again under the same grader gets the outcome it got, so identical
submissions get identical points even where the measurement is noisy; other code, and a run that died, is measured."""
import csv
import json
import random
import threading
import time
from pathlib import Path

import pytest

from labkit.grading import memo, student
from labkit.grading.cli import GradeConfig, GradeError, grade
from labkit.grading.judge import Outcome

ROOT = Path(__file__).resolve().parent.parent
JOB = {"name": "04_roofline", "cells": ["x = 1", "def f():\n    return x"], "functions": ["f"]}


def test_the_key_is_the_code_the_functions_and_the_grader(tmp_path):
    m = memo.Memo(tmp_path, "grader-1")
    assert m.key(JOB) == memo.Memo(tmp_path, "grader-1").key(dict(JOB))
    assert m.key(JOB) != m.key(dict(JOB, cells=["x = 2", JOB["cells"][1]]))
    assert m.key(JOB) != m.key(dict(JOB, functions=["f", "g"]))
    assert m.key(JOB) != memo.Memo(tmp_path, "grader-2").key(JOB)


def test_stored_outcomes_come_back_and_remeasure_or_a_bad_file_reads_as_none(tmp_path):
    m = memo.Memo(tmp_path, "g")
    key = m.key(JOB)
    assert m.get(key, ["f"]) is None
    m.put(key, {"f": Outcome(2, 1.5, "partial", ["on case 1: off"], {"speedup": 1.3})}, ["04_roofline: code cell 2 x"])
    outcomes, notes = m.get(key, ["f"])
    assert outcomes == {"f": Outcome(2, 1.5, "partial", ["on case 1: off"], {"speedup": 1.3})}
    assert notes == ["04_roofline: code cell 2 x"]
    assert m.get(key, ["f", "g"]) is None  # another set of functions: measured
    assert memo.Memo(tmp_path, "g", remeasure=True).get(key, ["f"]) is None
    (tmp_path / f"{key}.json").write_text("{not json")
    assert m.get(key, ["f"]) is None
    (tmp_path / f"{key}.json").unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps({"outcomes": {"f": {"points": 2, "score": 2.0}}, "notes": []}))
    (tmp_path / f"{key}.json").symlink_to(tmp_path / "elsewhere.json")
    assert m.get(key, ["f"]) is None  # a link is never followed


def test_a_key_is_held_by_one_grader_at_a_time(tmp_path):
    m, order = memo.Memo(tmp_path, "g"), []
    inside = threading.Event()

    def first():
        with m.locked(["b", "a"]):
            inside.set()
            time.sleep(0.3)
            order.append("first out")

    t = threading.Thread(target=first)
    t.start()
    inside.wait(5)
    with memo.Memo(tmp_path, "g").locked(["a"]):
        order.append("second in")
    t.join()
    assert order == ["first out", "second in"]


def test_the_fingerprint_follows_every_source_file_and_setting(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")
    before = memo.fingerprint([tmp_path / "pkg"], seed=1)
    assert memo.fingerprint([tmp_path / "pkg"], seed=2) != before
    (tmp_path / "pkg" / "a.py").write_text("A = 2\n")
    assert memo.fingerprint([tmp_path / "pkg"], seed=1) != before


def _notebook(extra: str = "") -> dict:
    nb = json.loads((ROOT / "solutions" / "04_roofline.ipynb").read_text())
    if extra:
        nb["cells"].append({"cell_type": "code", "id": "added-by-test", "metadata": {}, "outputs": [],
                            "execution_count": None, "source": extra})
    return nb


def _put(subs: Path, who: str, nb: dict) -> None:
    (subs / who).mkdir(parents=True)
    (subs / who / "04_roofline.ipynb").write_text(json.dumps(nb))


def _rows(out: Path) -> dict:
    with open(out / "grades.csv", newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


@pytest.fixture
def noisy_judge(monkeypatch):
    """The parent's judge with noise on every score (as a timed exercise has near a threshold): controlled."""
    rng, real = random.Random(0), student.judge

    def judge(spec, results, reason):
        out = real(spec, results, reason)
        if out.score:
            out.score = round(out.score * rng.uniform(0.2, 1.0), 2)
        return out
    monkeypatch.setattr(student, "judge", judge)


def test_identical_submissions_get_identical_points_however_noisy_the_measurement(tmp_path, noisy_judge,
                                                                                  grader_sandbox_flags):
    store, unsafe = tmp_path / "store", bool(grader_sandbox_flags)
    for who in ("ann", "bo", "cid"):
        _put(tmp_path / "class", who, _notebook())
    _put(tmp_path / "class", "dee", _notebook("# my own note: other code\n"))
    _put(tmp_path / "class", "eve", _notebook("import os\nos._exit(3)\n"))  # dies: measured every time
    for who in ("ann", "bo"):
        _put(tmp_path / "pair", who, _notebook())

    def run(subs: str, out: str, **kw) -> dict:
        grade(GradeConfig(tmp_path / subs, tmp_path / out, device="cpu", only=["04_roofline"], timeout=120,
                          unsafe_no_sandbox=unsafe, **kw))
        return _rows(tmp_path / out)

    cols = ("matmul_flops_bytes", "attainable_tflops")
    first = run("class", "g1", memo=store)
    assert len({tuple(first[w][c] for c in cols) for w in ("ann", "bo", "cid")}) == 1, first
    reused = [w for w in first if "identical code graded before" in first[w]["notes"]]
    assert reused == ["bo", "cid"]  # ann measured it; dee's code differs: measured too
    assert len(list(store.glob("*.json"))) == 2  # ann's code and dee's; eve's notebook died: not stored
    again = run("class", "g2", memo=store)  # another grading, another output folder: the same points for everyone
    assert {w: [again[w][c] for c in cols] for w in again} == {w: [first[w][c] for c in cols] for w in first}
    assert [w for w in again if "identical code graded before" not in again[w]["notes"]] == ["eve"]
    fresh = run("pair", "g3", memo=store, remeasure=True)
    assert not any("identical code graded before" in r["notes"] for r in fresh.values())
    off = run("pair", "off", memo="off")  # without the store the noise shows: the store is what guarantees it
    assert [off["ann"][c] for c in cols] != [off["bo"][c] for c in cols]


def test_the_store_may_not_overlap_the_submissions(tmp_path):
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    with pytest.raises(GradeError, match="overlap"):
        grade(GradeConfig(tmp_path / "subs", tmp_path / "out", device="cpu", memo=tmp_path / "subs" / "store"))


def test_an_outcome_the_graders_own_failure_decided_is_not_stored(tmp_path, monkeypatch, grader_sandbox_flags):
    """The workload the grader serves failing (as its baseline's process may) is the grader's fault: that outcome is
    never stored, and a later healthy grading of the same code measures it again."""
    from labkit.exercises import ex03_timing

    store, unsafe = tmp_path / "store", bool(grader_sandbox_flags)
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    (tmp_path / "subs" / "ann" / "03_timing.ipynb").write_text((ROOT / "solutions" / "03_timing.ipynb").read_text())

    def run(out: str) -> dict:
        grade(GradeConfig(tmp_path / "subs", tmp_path / out, device="cpu", only=["03_timing"], timeout=120,
                          memo=store, unsafe_no_sandbox=unsafe, workers=1))
        return _rows(tmp_path / out)["ann"]

    class Broken:
        def __init__(self, **plan):
            raise OSError("simulated: the grader's workload could not start")

    with monkeypatch.context() as m:
        m.setattr(ex03_timing, "Workload", Broken)  # in the parent: rounds.Driver serves it
        failed = run("g1")
    assert float(failed["median_ms"]) == 0, failed
    assert not list(store.glob("*.json"))  # nothing stored for the notebook
    healthy = run("g2")
    assert "identical code graded before" not in healthy["notes"], healthy
    assert float(healthy["median_ms"]) == 1, healthy
    assert len(list(store.glob("*.json"))) == 1  # measured by a healthy grader: stored now
