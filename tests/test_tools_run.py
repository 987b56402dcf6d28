"""`labkit run`: batch execution with papermill, a summary with figures, non-zero exit on failure."""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.paths import course_notebooks
from labkit.tools import run as runner
from labkit.paths import child_env

ROOT = Path(__file__).resolve().parent.parent
FIRST_TWO = [ROOT / "notebooks" / "00_why_gpus.ipynb", ROOT / "notebooks" / "01_device_placement.ipynb"]


def _notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def _run(*args: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = child_env(ROOT, LABKIT_QUICK="1", **env_extra)
    return subprocess.run([sys.executable, "-m", "labkit.cli", "run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_parameter_values_parse_like_papermill():
    assert runner.parse_value("1") == 1 and runner.parse_value("true") is True
    assert runner.parse_value("null") is None and runner.parse_value("cuda") == "cuda"


def test_batch_goes_on_past_a_broken_notebook_and_fails_the_exit_code(tmp_path):
    broken = _notebook(tmp_path / "zz_broken.ipynb", "scale = 1", "import labkit\nlabkit.record('before', 2.0, 'x')",
                       "raise ValueError('deliberately broken')")
    out = tmp_path / "build"
    result = _run(*map(str, FIRST_TWO), str(broken), "-o", str(out), "-p", "quick", "true")
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parameters"] == {"quick": True}
    by_name = {Path(e["notebook"]).name: e for e in summary["notebooks"]}
    for path in FIRST_TWO:
        entry = by_name[path.name]
        assert entry["status"] == "ok", entry["error"]
        assert entry["figures"], f"{path.name} recorded no figures"
        assert (out / path.name).exists()
    bad = by_name["zz_broken.ipynb"]
    assert bad["status"] == "failed" and "deliberately broken" in bad["error"]
    assert bad["figures"]["before"]["value"] == 2.0  # figures recorded before the failure are kept
    page = (out / "summary.md").read_text()
    assert "failed" in page and "deliberately broken" in page and "00_why_gpus.ipynb" in page


def test_parameters_reach_the_notebook(tmp_path):
    nb = _notebook(tmp_path / "p.ipynb", "scale = 1", "import labkit\nlabkit.record('scaled', scale * 3.0)")
    result = _run(str(nb), "-o", str(tmp_path / "b"), "-p", "scale", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    entry = json.loads((tmp_path / "b" / "summary.json").read_text())["notebooks"][0]
    assert entry["figures"]["scaled"]["value"] == 15.0


def test_missing_notebook_is_a_clear_error(tmp_path):
    result = _run(str(tmp_path / "nope.ipynb"))
    assert result.returncode == 2 and "no such notebook" in result.stderr


def test_default_is_every_numbered_notebook_in_order():
    names = [p.name for p in course_notebooks()]
    assert names == sorted(names) and "index.ipynb" not in names and names[0].startswith("00_")


def test_summary_holds_claims_machine_and_date_and_names_the_cell_that_stopped(tmp_path):
    nb = _notebook(tmp_path / "claims.ipynb", "quick = None",
                   "import labkit\nlabkit.setup(quick=True)\n"
                   "labkit.claim('fast', 'it is fast', True, figures={'rate': (3.14159, 'GB/s')})\n"
                   "labkit.claim('odd', 'it is even', False, diagnoses=[labkit.diagnosis('odd', 'this machine is odd', "
                   "holds=True)])\n"
                   "labkit.skip_claim('gpu', 'a GPU wins', needs='a CUDA GPU')",
                   "import time\ntime.sleep(300)")
    out = tmp_path / "build"
    # 20 s per cell: the claims cell imports torch, which takes several seconds on a busy GPU host
    result = _run(str(nb), "-o", str(out), "--timeout", "20")
    assert result.returncode == 1
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["notebooks"][0]
    assert entry["claim_counts"] == {"held": 1, "differs": 1, "failed": 0, "inconclusive": 0, "skipped": 1}
    assert entry["claims"]["odd"]["note"] == "odd: this machine is odd"
    assert "time.sleep(300)" in entry["error"], entry["error"]  # which cell timed out
    assert summary["machine"]["torch"] and summary["finished"] and summary["quick"] is True
    md = (out / "summary.md").read_text()
    assert "| fast | held | rate 3.142 GB/s |" in md and "| 1 / 1 / 0 / 0 / 1 |" in md
    assert "claims: 1 held, 1 differ (diagnosed), 0 failed, 0 inconclusive, 1 skipped" in result.stdout
    assert not list(tmp_path.glob("kernel-ipc*")), "the stopped kernel's sockets were left beside the notebook"


def test_a_reference_run_needs_a_gpu(tmp_path):
    nb = _notebook(tmp_path / "tiny.ipynb", "quick = None", "x = 1")
    result = _run(str(nb), "-o", str(tmp_path / "b"), "--reference", CUDA_VISIBLE_DEVICES="")  # a GPU host too
    assert result.returncode != 0 and "must be made on a GPU host" in result.stdout + result.stderr


def test_a_reference_batch_cut_short_keeps_the_notebooks_that_finished(tmp_path, monkeypatch):
    """--reference saves after each notebook: a batch killed by a time limit in its second notebook has the first
    in reference/<machine>/."""
    first, second = (_notebook(tmp_path / f"{n}.ipynb", "quick = None", "x = 1") for n in ("01_a", "02_b"))

    def run_one(path, out_dir, parameters, timeout_s):
        if path == second:
            raise KeyboardInterrupt  # the host's time limit, mid-notebook
        nbformat.write(nbformat.read(path, as_version=4), out_dir / path.name)
        return {"notebook": str(path), "output": str(out_dir / path.name), "status": "ok", "error": None,
                "duration_s": 1.0, "figures": {}, "claims": {}, "claim_counts": {}}

    monkeypatch.setattr(runner, "run_one", run_one)
    monkeypatch.setattr(runner, "run_facts", lambda parameters: {"machine": {"GPU": "NVIDIA H100", "GPUs": "1"}})
    monkeypatch.setattr(runner.reference, "ROOT", tmp_path / "reference")
    with pytest.raises(KeyboardInterrupt):
        runner.main([str(first), str(second), "-o", str(tmp_path / "build"), "--reference"])
    saved = json.loads((tmp_path / "reference" / "nvidia-h100" / "summary.json").read_text())
    assert [e["notebook"] for e in saved["notebooks"]] == ["01_a.ipynb"]


def test_a_misspelt_parameter_is_refused_naming_it(tmp_path):
    nb = _notebook(tmp_path / "tiny.ipynb", "quick = None", "x = 1")
    result = _run(str(nb), "-o", str(tmp_path / "b"), "-p", "qiuck", "true")
    assert result.returncode == 2 and "unknown parameter 'qiuck'" in result.stderr
    assert "Did you mean 'quick'" in result.stderr
    assert not (tmp_path / "b" / "tiny.ipynb").exists()  # refused before anything ran


@pytest.mark.parametrize("value", ["[1, 2]", "maybe", "2"])
def test_a_malformed_quick_is_refused_naming_it(tmp_path, value):
    nb = _notebook(tmp_path / "tiny.ipynb", "quick = None", "x = 1")
    result = _run(str(nb), "-o", str(tmp_path / "b"), "-p", "quick", value)
    assert result.returncode == 2 and "parameter quick=" in result.stderr, result.stderr


def test_values_of_the_wrong_kind_are_refused(tmp_path):
    nb = _notebook(tmp_path / "tiny.ipynb", "quick = None\nreps = 3\ndevice = None", "x = 1")
    with pytest.raises(ValueError, match=r"parameter reps=\[1\].*int"):
        runner.check_parameters({"reps": [1]}, [nb])
    with pytest.raises(ValueError, match="parameter device="):
        runner.check_parameters({"device": [0]}, [nb])
    shares = runner.check_parameters({"reps": 5, "quick": "False"}, [nb])
    assert shares[nb] == {"reps": 5, "quick": "False"}


def test_a_none_default_is_checked_against_its_annotation(tmp_path):
    nb = _notebook(tmp_path / "tiny.ipynb", "quick = None\nmax_bytes: int = None  # bytes\nsizes: list = None\n"
                   "run_s: float = None", "x = 1")
    with pytest.raises(ValueError, match=r"parameter max_bytes='lots'.*expects an int \(e\.g\. -p max_bytes 4096\)"):
        runner.check_parameters({"max_bytes": "lots"}, [nb])
    with pytest.raises(ValueError, match=r"parameter sizes=3.*list"):
        runner.check_parameters({"sizes": 3}, [nb])
    assert runner.check_parameters({"max_bytes": 4096, "sizes": [1, 2], "run_s": 2}, [nb])[nb]["run_s"] == 2
    assert runner.check_parameters({"max_bytes": None}, [nb])[nb] == {"max_bytes": None}
    result = _run(str(nb), "-o", str(tmp_path / "b"), "-p", "max_bytes", "lots")
    assert result.returncode == 2 and "parameter max_bytes='lots'" in result.stderr
    assert not (tmp_path / "b" / "tiny.ipynb").exists()  # refused before anything ran


def test_a_device_that_is_not_one_is_refused_up_front(tmp_path):
    nb = _notebook(tmp_path / "tiny.ipynb", "quick = None\ndevice = None", "x = 1")
    with pytest.raises(ValueError, match="parameter device='gpu' is not a device name"):
        runner.check_parameters({"device": "gpu"}, [nb])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_full_size_without_a_gpu_is_refused_up_front(tmp_path):
    nb = _notebook(tmp_path / "tiny.ipynb", "quick = None", "x = 1")
    result = _run(str(nb), "-o", str(tmp_path / "b"), "-p", "quick", "False")
    assert result.returncode == 2 and "full size without a GPU" in result.stderr and "--full-on-cpu" in result.stderr


def test_papermill_string_false_reaches_setup_as_false(tmp_path):
    nb = _notebook(tmp_path / "q.ipynb", "quick = None",
                   "import warnings, labkit\nwith warnings.catch_warnings():\n    warnings.simplefilter('ignore')\n"
                   "    cfg = labkit.setup(quick=quick)\nlabkit.record('quick', float(cfg.quick))")
    entry = runner.run_one(nb, tmp_path, {"quick": "False"}, timeout_s=120)
    assert entry["status"] == "ok", entry["error"]
    assert entry["figures"]["quick"]["value"] == 0.0


def test_batch_runs_are_quiet_no_tcp_warning_no_frozen_progress_bars(tmp_path, capfd):
    nb = _notebook(tmp_path / "bar.ipynb", "quick = None",
                   "from tqdm.auto import tqdm\nfor _ in tqdm(range(3)):\n    pass\nprint('done')")
    (tmp_path / "out").mkdir()
    entry = runner.run_one(nb, tmp_path / "out", {}, timeout_s=120)
    assert entry["status"] == "ok", entry["error"]
    err = capfd.readouterr().err
    assert "without encryption" not in err
    executed = nbformat.read(tmp_path / "out" / "bar.ipynb", as_version=4)
    outputs = executed.cells[1].outputs
    assert [o.get("text", "") for o in outputs] == ["done\n"], outputs  # no widget, no text bar
    assert not list(tmp_path.glob("kernel-ipc*")), "the kernel's sockets were left beside the notebook"


def test_a_run_stores_the_commit_it_ran_from_and_whether_the_tree_was_dirty(tmp_path):
    import re
    import subprocess

    from labkit.paths import source_commit
    from labkit.tools.run import not_made

    assert source_commit(tmp_path) == {"commit": None, "dirty": None}  # not a git checkout
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.txt").write_text("1")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    clean = source_commit(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", clean["commit"]) and clean["dirty"] is False
    (tmp_path / "a.txt").write_text("2")
    assert source_commit(tmp_path) == {**clean, "dirty": True}
    sent = "ab" * 20  # a copy of a tree made elsewhere names the commit it was sent from
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LABKIT_SOURCE_COMMIT", sent)
        assert source_commit(tmp_path) == {"commit": sent, "dirty": False}
        env.setenv("LABKIT_SOURCE_COMMIT", sent + "+dirty")
        assert source_commit(tmp_path) == {"commit": sent, "dirty": True}
        env.setenv("LABKIT_SOURCE_COMMIT", "HEAD")
        with pytest.raises(ValueError, match="full commit"):
            source_commit(tmp_path)
    nb = tmp_path / "04_x.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "outputs": [],
                                         "source": 'labkit.claim("a" if gpu else "b_on_cpu", "e", True)'}]}))
    assert not_made(nb, {"a": {}}) == ["b_on_cpu"]
