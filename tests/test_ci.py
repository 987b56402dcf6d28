"""The CI definitions: the workflow is valid and its jobs call .ci/run and .ci/gpu; .ci/gpu keeps plots and reports."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
FORK_GATE = "github.event.pull_request.head.repo.full_name == github.repository"


def workflow() -> dict:
    yaml = pytest.importorskip("yaml")
    assert len(WORKFLOWS) == 1, "one workflow file, .github/workflows/ci.yml"
    return yaml.safe_load(WORKFLOWS[0].read_text())


def runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def labels(job: dict) -> list[str]:
    return [job["runs-on"]] if isinstance(job["runs-on"], str) else list(job["runs-on"])


def test_workflow_has_triggers_and_well_formed_jobs():
    wf = workflow()
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    assert {"push", "pull_request"} <= set(triggers)
    for name, job in wf["jobs"].items():
        assert job.get("runs-on") and job.get("steps"), f"job {name} needs runs-on and steps"
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), f"job {name}: a step either uses an action or runs"
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]), step["uses"]


def test_cpu_job_runs_the_readme_command_on_a_hosted_runner():
    jobs = [j for j in workflow()["jobs"].values() if "bash .ci/run" in runs(j)]
    assert jobs, "a job runs .ci/run (python3 course.py test)"
    assert all(labels(j)[0].startswith("ubuntu-") and "gpu" not in labels(j) for j in jobs)
    assert "python3 course.py test" in (ROOT / ".ci" / "run").read_text()


def test_a_drift_job_tests_the_newest_allowed_versions_without_blocking():
    jobs = [j for j in workflow()["jobs"].values() if "course.py test --latest" in runs(j)]
    assert len(jobs) == 1 and jobs[0].get("continue-on-error") is True
    assert "--latest" in (ROOT / "course.py").read_text()


def test_gpu_jobs_run_on_a_gpu_runner_never_for_forks_and_call_ci_gpu():
    gpu_jobs = {n: j for n, j in workflow()["jobs"].items() if ".ci/gpu" in runs(j)}
    assert gpu_jobs
    for name, job in gpu_jobs.items():
        assert {"self-hosted", "gpu"} <= set(labels(job)), name
        assert FORK_GATE in job.get("if", "") and "pull_request" in job["if"], f"{name}: forks' PRs must not run"
        uploads = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
        assert uploads and all(s.get("if") == "always()" for s in uploads), f"{name}: upload even after a failure"
    every = " ".join(runs(j) for j in gpu_jobs.values())
    for step in ("info", "test", "shuffled", "notebooks", "bench", "compare"):
        assert re.search(rf"bash \.ci/gpu \S+ [a-z ]*\b{step}\b", every), f"no GPU job runs the {step} step"
    paths = " ".join(s["with"]["path"] for j in gpu_jobs.values() for s in j["steps"] if "path" in s.get("with", {}))
    assert "run/*.ipynb" in paths and "summary.json" in paths and "bench." in paths


def test_sharded_notebook_job_passes_its_shard():
    jobs = [j for j in workflow()["jobs"].values() if "notebooks" in runs(j)]
    assert len(jobs) == 1
    assert "matrix.shard" in jobs[0]["env"]["LABKIT_SHARD"] and "strategy.job-total" in jobs[0]["env"]["LABKIT_SHARD"]
    assert "gpu" in (ROOT / ".github" / "actionlint.yaml").read_text()  # the runner label actionlint must know


@pytest.mark.skipif(shutil.which("actionlint") is None, reason="actionlint is not installed here")
def test_actionlint_accepts_the_workflow():
    done = subprocess.run(["actionlint", *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("check-jsonschema") is None, reason="check-jsonschema is not installed here")
def test_workflow_matches_the_github_workflow_schema():
    done = subprocess.run(["check-jsonschema", "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ci_gpu_is_valid_bash_keeps_plots_and_runs_every_step():
    script = (ROOT / ".ci" / "gpu").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / ".ci" / "gpu")]).returncode == 0
    assert "MPLBACKEND=Agg" not in script and "env -u MPLBACKEND" in script
    default = re.search(r"steps=\$\{\*:-([a-z ]+)\}", script).group(1).split()
    assert default == ["info", "test", "shuffled", "notebooks", "bench", "compare"]
    assert "--random-order-seed" in script and "labkit.cli ran" in script and "baseline compare" in script
    assert "--no-index" in script  # a GPU host without a package index installs the carried wheels


def test_ci_gpu_prints_a_table_and_fails_on_a_bad_step(tmp_path):
    env = dict(os.environ, CI_WHEELS=str(tmp_path / "no-wheels"), CI_GPU_ALLOW_CPU="1")
    done = subprocess.run(["bash", str(ROOT / ".ci" / "gpu"), str(tmp_path / "out"), "nonsense"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    table = done.stdout.split("=== .ci/gpu results")[1]
    assert re.search(r"^nonsense\s+FAILED", table, re.M)
    assert (tmp_path / "out" / "steps.txt").read_text().strip().endswith(table.strip().splitlines()[-1].strip())


def _course_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_for_test", ROOT / "course.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="reads the cores this process may use")
def test_course_py_test_runs_two_workers_only_where_no_gpu_is_measured(tmp_path, monkeypatch, capsys):
    """Two pytest-xdist workers (files whole, the course's notebooks with the tests that read their log) on a
    machine of two cores or more without a GPU; one process on a GPU host, in a --full run, for one path, or where
    LABKIT_TEST_WORKERS or -n decides."""
    course = _course_module()
    two = ["-n", "2", "--dist", "loadfile"]
    fake = {}
    for name, gpu in (("cpu", 0), ("gpu", 1)):  # stands in for the venv's python asking torch for a GPU
        fake[name] = tmp_path / name
        fake[name].write_text(f"#!/bin/sh\necho {gpu}\n")
        fake[name].chmod(0o755)
    monkeypatch.delenv("LABKIT_TEST_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert course.test_workers(str(fake["cpu"]), False, 4, []) == two
    assert course.test_workers(str(fake["gpu"]), False, 4, []) == []
    assert course.test_workers(str(fake["cpu"]), True, 4, []) == []  # --full measures
    assert course.test_workers(str(fake["cpu"]), False, 1, []) == []
    assert course.test_workers(str(fake["cpu"]), False, 4, ["-n0"]) == []  # the user's -n is theirs
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert course.test_workers(str(fake["cpu"]), False, 4, []) == []
    monkeypatch.setenv("LABKIT_TEST_WORKERS", "1")
    assert course.test_workers(str(fake["cpu"]), False, 4, []) == []
    monkeypatch.setenv("LABKIT_TEST_WORKERS", "2")
    assert course.test_workers(str(fake["gpu"]), True, 4, []) == two  # told
    monkeypatch.setenv("LABKIT_TEST_WORKERS", "two")
    with pytest.raises(SystemExit, match="not a number"):
        course.test_workers(str(fake["cpu"]), False, 4, [])
