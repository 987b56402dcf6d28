"""A failed claim fails what runs the notebooks: the notebook tests (`course.py test`), `labkit run` and the GPU
CI's notebooks step (`.ci/gpu ... notebooks`), while a diagnosed difference does not."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.paths import child_env

ROOT = Path(__file__).resolve().parent.parent


def notebook(path: Path, verdict_code: str) -> Path:
    nb = {"cells": [
        {"cell_type": "code", "id": "p", "metadata": {"tags": ["parameters"]}, "outputs": [], "execution_count": None,
         "source": "device = None\nquick = None"},
        {"cell_type": "code", "id": "c", "metadata": {}, "outputs": [], "execution_count": None,
         "source": "import labkit\ncfg = labkit.setup(device='cpu', quick=True)\n" + verdict_code},
        {"cell_type": "code", "id": "after", "metadata": {}, "outputs": [], "execution_count": None,
         "source": "print('the next cell ran')"}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))
    return path


FAILS = "labkit.claim('two_is_odd', 'two is odd', lambda f: f['n'] % 2 == 1, figures={'n': 2})"
DIFFERS = ("labkit.claim('two_is_odd', 'two is odd', lambda f: f['n'] % 2 == 1, figures={'n': 2},\n"
           "             diagnoses=[labkit.diagnosis('even', 'two is even', holds=2 % 2 == 0)])")


@pytest.mark.parametrize("code, fails", [(FAILS, True), (DIFFERS, False)], ids=["failed", "diagnosed"])
def test_course_py_test_fails_on_a_failed_claim(tmp_path, code, fails):
    nb = notebook(tmp_path / "toy.ipynb", code)
    env = child_env(ROOT)
    env.pop("LABKIT_CLAIMS_STRICT", None)  # course.py sets it for the notebooks it tests
    done = subprocess.run([sys.executable, str(ROOT / "course.py"), "test", "--", str(nb)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert (done.returncode != 0) == fails, out[-3000:]
    if fails:
        assert "ClaimFailed" in out and "two_is_odd" in out


def test_labkit_run_exits_1_on_a_failed_claim_and_lists_it(tmp_path):
    nb = notebook(tmp_path / "toy.ipynb", FAILS)
    run = [sys.executable, "-m", "labkit.cli", "run", str(nb), "-o", str(tmp_path / "out")]
    done = subprocess.run(run, cwd=ROOT, env=child_env(ROOT), capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "FAILED CLAIM  toy.ipynb: two_is_odd" in done.stdout, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["notebooks"][0]["claims"]["two_is_odd"]["status"] == "failed"
    assert "## Failed claims" in (tmp_path / "out" / "summary.md").read_text()
    assert "the next cell ran" in (tmp_path / "out" / "toy.ipynb").read_text()  # a batch records every claim
    explore = subprocess.run([*run, "--allow-failed-claims"], cwd=ROOT, env=child_env(ROOT), capture_output=True,
                             text=True, timeout=600)
    assert explore.returncode == 0, explore.stdout + explore.stderr


@pytest.mark.parametrize("code, fails", [(FAILS, True), (DIFFERS, False)], ids=["failed", "diagnosed"])
def test_the_gpu_ci_notebooks_step_fails_on_a_failed_claim(tmp_path, code, fails):
    nb = notebook(tmp_path / "toy.ipynb", code)
    env = child_env(ROOT, CI_WHEELS=str(tmp_path / "no-wheels"), CI_GPU_ALLOW_CPU="1", CI_NOTEBOOKS=str(nb),
                    PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    env.pop("LABKIT_SHARD", None)
    done = subprocess.run(["bash", str(ROOT / ".ci" / "gpu"), str(tmp_path / "gpu"), "notebooks"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    table = done.stdout.split("=== .ci/gpu results")[-1]
    assert (done.returncode == 1) == fails, done.stdout[-3000:] + done.stderr[-2000:]
    assert ("notebooks  FAILED" in table) == fails, table
    if fails:
        assert "claim 'two_is_odd' failed" in (tmp_path / "gpu" / "notebooks.log").read_text()
    assert os.path.exists(tmp_path / "gpu" / "run" / "summary.json")
