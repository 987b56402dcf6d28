"""Workers that do not disturb each other's timings: each pinned to cores of its own (and a GPU of its own), and
`labkit grade` refusing more workers than that allows unless told to share (--share-gpus, --share-cores)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.grading import cli
from labkit.grading.cli import GradeConfig, GradeError, grade, split_cores
from labkit.paths import child_env

ROOT = Path(__file__).resolve().parent.parent


def test_each_worker_gets_cores_of_its_own():
    assert split_cores([0, 1, 2, 3, 4, 5, 6, 7], 3) == [[0, 1], [2, 3], [4, 5]]
    assert split_cores([0, 1], 1) == [[0, 1]]
    assert split_cores([4, 9], 3) == [[4], [9], [4]]  # --share-cores: one core each, round robin


@pytest.fixture
def subs(tmp_path: Path) -> Path:
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    for nb in ("03_timing", "04_roofline"):
        (tmp_path / "subs" / "ann" / f"{nb}.ipynb").write_text((ROOT / "exercises" / f"{nb}.ipynb").read_text())
    return tmp_path / "subs"


class Started(Exception):
    """Raised where the sandbox would start: the configuration was accepted."""


def test_too_many_workers_for_the_cores_or_gpus_are_refused_unless_told(subs, tmp_path, monkeypatch):
    def no_sandbox(*args, **kwargs):
        raise Started()

    monkeypatch.setattr(cli.sandbox, "make", no_sandbox)
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    out = tmp_path / "out"
    with pytest.raises(GradeError, match="--workers 2, or --share-cores"):  # 03_timing is timed: 2 cores a worker
        grade(GradeConfig(subs, out, workers=3, device="cpu"))
    for ok in (GradeConfig(subs, out, workers=3, device="cpu", share_cores=True),
               GradeConfig(subs, out, workers=2, device="cpu"),
               GradeConfig(subs, out, workers=4, device="cpu", only=["04_roofline"])):  # nothing timed
        with pytest.raises(Started):
            grade(ok)

    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "gpu_ids", lambda: ["0", "1"])
    with pytest.raises(GradeError, match="3 workers for 2 GPU.*--workers 2, or --share-gpus"):
        grade(GradeConfig(subs, out, workers=3, only=["04_roofline"]))


def test_the_grading_child_runs_on_its_workers_cores_only(tmp_path, grader_sandbox_flags):
    """Two students graded at once: each child runs on its own share of the cores."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    notebook = json.loads((ROOT / "exercises" / "01_device_placement.ipynb").read_text())
    notebook["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                              "id": "cores",
                              "source": "import os\nraise RuntimeError(f'cores {sorted(os.sched_getaffinity(0))}')"})
    for student in ("ann", "bo"):
        (subs / student).mkdir(parents=True)
        (subs / student / "01_device_placement.ipynb").write_text(json.dumps(notebook))
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    run = subprocess.run([sys.executable, "-m", "labkit.cli", "grade", str(subs), "--out", str(out), "--workers", "2",
                          "--device", "cpu", "--timeout", "60", *grader_sandbox_flags], cwd=ROOT, env=child_env(ROOT),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = [set(json.loads((out / "feedback" / f"{s}.md").read_text().split("RuntimeError: cores ")[1].split("]")[0]
                           + "]")) for s in ("ann", "bo")]
    assert seen[0] and seen[1] and not seen[0] & seen[1], seen
    assert seen[0] | seen[1] <= os.sched_getaffinity(0)


def test_a_cell_that_widens_its_cores_is_pinned_back_from_outside(tmp_path, grader_sandbox_flags):
    """The child's pinning is its own call, which student code can undo: the watchdog sets it back, and says so."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    subs, out = tmp_path / "subs", tmp_path / "out"
    notebook = json.loads((ROOT / "exercises" / "01_device_placement.ipynb").read_text())
    notebook["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                              "id": "widen", "source": (
                                  "import os, threading, time\nmine = sorted(os.sched_getaffinity(0))\n"
                                  "def widen():\n    os.sched_setaffinity(0, set(range(os.cpu_count())))\n"
                                  "    time.sleep(1.0)\n    seen.append(sorted(os.sched_getaffinity(0)))\n"
                                  "seen = []\nt = threading.Thread(target=widen)\nt.start()\n"  # a thread's own
                                  "os.sched_setaffinity(0, set(range(os.cpu_count())))\n"
                                  "wide = sorted(os.sched_getaffinity(0))\ntime.sleep(1.0)\nt.join()\n"
                                  "then = sorted(os.sched_getaffinity(0))\n"
                                  "raise RuntimeError(f'cores {mine} wide {wide} then {then} thread {seen[0]}')")})
    for student in ("ann", "bo"):
        (subs / student).mkdir(parents=True)
        (subs / student / "01_device_placement.ipynb").write_text(json.dumps(notebook))
    grade(GradeConfig(subs, out, workers=2, device="cpu", timeout=60, memo="off",
                      unsafe_no_sandbox=bool(grader_sandbox_flags)))
    for student in ("ann", "bo"):
        feedback = (out / "feedback" / f"{student}.md").read_text()
        found = re.search(r"RuntimeError: cores (\[[\d, ]*\]) wide (\[[\d, ]*\]) then (\[[\d, ]*\]) "
                          r"thread (\[[\d, ]*\])", feedback)
        assert found, feedback
        mine, wide, then, thread = (json.loads(g) for g in found.groups())
        assert len(wide) > len(mine), feedback  # the widening itself worked: one call undoes the child's pinning
        assert then == thread == mine, feedback  # ...and within a second the parent had set it back, every thread
        assert f"widened its CPU affinity; it was pinned back to cores {mine}" in feedback, feedback
