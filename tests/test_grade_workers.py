"""Workers that do not disturb each other's timings: each pinned to cores of its own (and a GPU of its own), and
`labkit grade` refusing more workers than that allows unless told to share (--share-gpus, --share-cores)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.grading import cli, sandbox
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


def _driver_files(proc: Path, gpus: dict[str, int]) -> None:
    """A fake /proc/driver/nvidia/gpus: one folder per GPU, as the NVIDIA driver writes it."""
    for i, (uuid, minor) in enumerate(gpus.items()):
        bus = f"0000:{0x19 + i:02x}:00.0"
        (proc / bus).mkdir(parents=True)
        (proc / bus / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\n"
            f"Device Minor: \t {minor}\nGPU Excluded:\t No\n")


def test_each_worker_sees_the_device_node_of_its_own_gpu_only(tmp_path):
    """A worker's sandbox binds its GPU's /dev/nvidia<minor> and the driver's shared nodes, no other GPU's node,
    and CUDA inside names that GPU by its UUID (the host's index means nothing where one GPU is left)."""
    _driver_files(tmp_path / "gpus", {"GPU-aaaa": 4, "GPU-bbbb": 6})
    assert sandbox.gpu_minors(str(tmp_path / "gpus")) == {"GPU-aaaa": 4, "GPU-bbbb": 6}
    devices = ["/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia4", "/dev/nvidia6",
               "/dev/nvidia60", "/dev/nvidiactl"]
    assert sandbox.own_gpu_nodes(devices, 6) == ["/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                                 "/dev/nvidia6", "/dev/nvidiactl"]
    own, why = sandbox.own_gpus(["0", "1"], ["aaaa", "GPU-bbbb"], devices, str(tmp_path / "gpus"))
    assert why is None and own["1"] == ("GPU-bbbb", sandbox.own_gpu_nodes(devices, 6))
    box = sandbox.Bwrap("bwrap", [], devices=devices, gpus=own)
    argv, _ = box.command("labkit.grading.child", tmp_path, tmp_path, {"CUDA_VISIBLE_DEVICES": "0"}, tmp_path)
    bound = [argv[i + 1] for i, a in enumerate(argv) if a == "--dev-bind-try"]
    assert "/dev/nvidia4" in bound and not {"/dev/nvidia6", "/dev/nvidia60"} & set(bound)
    assert argv[argv.index("CUDA_VISIBLE_DEVICES") + 1] == "GPU-aaaa"


def test_a_gpu_without_a_node_of_its_own_leaves_every_node_bound_and_says_why(tmp_path):
    _driver_files(tmp_path / "gpus", {"GPU-aaaa": 0})
    devices = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"]
    for uuids in (["aaaa", "MIG-cccc"], ["aaaa", "dddd"]):  # a MIG slice; a GPU the driver files do not list
        own, why = sandbox.own_gpus(["0", "1"], uuids, devices, str(tmp_path / "gpus"))
        assert own == {} and "has no /dev/nvidia<N> of its own" in why
    box = sandbox.Bwrap("bwrap", [], devices=devices)
    argv, _ = box.command("labkit.grading.child", tmp_path, tmp_path, {"CUDA_VISIBLE_DEVICES": "1"}, tmp_path)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--dev-bind-try"] == devices
    assert argv[argv.index("CUDA_VISIBLE_DEVICES") + 1] == "1"


@pytest.mark.skipif(sandbox.problem() is not None, reason="no bubblewrap sandbox here")
def test_inside_the_sandbox_another_workers_gpu_node_does_not_exist(tmp_path):
    """What a student's process sees: its GPU's node and the shared ones; the other GPU's node is absent, and a
    device node cannot be made there (stand-in nodes: regular files, as no GPU is here)."""
    nodes = tmp_path / "dev"
    nodes.mkdir()
    devices = [str(nodes / n) for n in ("nvidia0", "nvidia1", "nvidiactl")]
    for d in devices:
        Path(d).write_text(os.path.basename(d))
    own = {"1": ("GPU-bbbb", sandbox.own_gpu_nodes(devices, 1))}
    box = sandbox.make([], False, 512, unsafe=False, imports=False)
    box.devices, box.gpus = devices, own
    code = ("import os, sys; d = sys.argv[1]; print(sorted(os.listdir(d)), os.environ['CUDA_VISIBLE_DEVICES']); "
            "os.mknod(d + '/nvidia9', 0o666 | 0o020000, os.makedev(195, 0))")
    argv, _ = box.command("labkit.grading.child", tmp_path, tmp_path, {"CUDA_VISIBLE_DEVICES": "1"}, tmp_path)
    argv = argv[:argv.index("--") + 1] + [sys.executable, "-c", code, str(nodes)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "['nvidia1', 'nvidiactl'] GPU-bbbb", run.stdout + run.stderr
    assert run.returncode != 0 and ("PermissionError" in run.stderr or "Read-only" in run.stderr), run.stderr
