"""pyproject.toml and environment.yml install the same packages at the same versions, and both parse."""
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"pytorch": "torch"}  # conda-forge name -> PyPI name


def pip_requirements() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {Requirement(d).name.lower(): Requirement(d) for d in deps}


def environment() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def conda_specs() -> dict[str, str]:
    """name -> version spec (as conda reads 'name>=1.2' or 'name==1.2'), PyPI names."""
    found = {}
    for dep in environment()["dependencies"]:
        if isinstance(dep, str):
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", dep.strip())
            found[CONDA_NAMES.get(m.group(1), m.group(1)).lower()] = m.group(2).replace(" ", "")
    return found


def pip_section() -> list[str]:
    return next(d["pip"] for d in environment()["dependencies"] if isinstance(d, dict))


def course_torch() -> str:
    text = (ROOT / "course.py").read_text()
    return re.search(r'TORCH_TESTED = "torch==([^"]+)"', text).group(1)


def test_the_two_package_lists_agree():
    conda = set(conda_specs()) - {"python", "pip"}
    pip = set(pip_requirements()) - {"triton"}
    assert conda == pip


def test_versions_agree_not_only_names():
    conda, pip = conda_specs(), pip_requirements()
    for name, req in pip.items():
        if name in ("torch", "triton"):
            continue
        assert SpecifierSet(conda[name]) == req.specifier, f"{name}: conda {conda[name]} vs pip {req.specifier}"
    assert re.fullmatch(r"==\d+\.\d+\.\d+", conda["torch"]), "pin PyTorch in environment.yml"
    assert conda["torch"] == f"=={course_torch()}", "environment.yml and course.py must pin the same torch"
    assert course_torch() in pip["torch"].specifier  # pyproject accepts the tested torch
    assert SpecifierSet(conda["python"]) == SpecifierSet(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])


def test_triton_only_where_it_exists():
    triton = pip_requirements()["triton"]
    assert triton.marker is not None
    assert triton.marker.evaluate({"platform_system": "Linux"})
    assert not triton.marker.evaluate({"platform_system": "Darwin"}) and not triton.marker.evaluate(
        {"platform_system": "Windows"})
    assert "triton" not in conda_specs(), "conda-forge has no triton for macOS or Windows: leave it to pip's marker"


def test_the_pip_section_is_a_valid_requirements_file(tmp_path):
    """conda writes the pip: entries to a requirements file and runs pip in this folder; so does this test."""
    lines = pip_section()
    assert lines == ["-e ."], lines
    req = tmp_path / "requirements.txt"
    req.write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation",
                          "--no-index", "-q", "-r", str(req)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_conda_environment_uses_conda_forge_only():
    env = environment()
    assert env["channels"] == ["conda-forge"] and env["name"] == "gpu-course"
    assert "defaults" not in (ROOT / "environment.yml").read_text()


def test_core_packages_are_all_there():
    assert {"jupyterlab", "torch", "triton", "matplotlib", "ipywidgets", "nbval", "papermill"} <= set(pip_requirements())


def test_labkit_console_command_is_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["labkit"] == "labkit.cli:main"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(python3 course\.py \w+)", readme, flags=re.M)
    assert commands[:2] == ["python3 course.py start", "python3 course.py test"]
    assert "python3 course.py test" in (ROOT / ".ci" / "run").read_text()

