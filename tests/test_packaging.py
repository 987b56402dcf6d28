"""pyproject.toml and environment.yml install the same packages."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"pytorch": "torch"}  # conda-forge name -> PyPI name


def _name(spec: str) -> str:
    return re.split(r"[<>=!~;:\s\[]", spec.strip(), maxsplit=1)[0].lower()


def pip_packages() -> set[str]:
    return {_name(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}


def conda_packages() -> set[str]:
    names, in_deps = set(), False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if line.startswith("dependencies:"):
            in_deps = True
        elif in_deps and re.match(r"^  - [A-Za-z]", line):
            name = _name(line[4:])
            names.add(CONDA_NAMES.get(name, name))
    return names - {"python", "pip"}


def test_the_two_package_lists_agree():
    assert pip_packages() == conda_packages()


def test_conda_environment_uses_conda_forge_only():
    text = (ROOT / "environment.yml").read_text()
    channels = re.search(r"channels:\n((?:  - .*\n)+)", text).group(1).split()
    assert [c for c in channels if c != "-"] == ["conda-forge"]
    assert "defaults" not in text and "pytorch" not in channels


def test_core_packages_are_all_there():
    assert {"jupyterlab", "torch", "triton", "matplotlib", "ipywidgets", "nbval", "papermill"} <= pip_packages()


def test_labkit_console_command_is_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["labkit"] == "labkit.cli:main"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(python3 course\.py \w+)", readme, flags=re.M)
    assert commands[:2] == ["python3 course.py start", "python3 course.py test"]
    assert "python3 course.py test" in (ROOT / ".ci" / "run").read_text()
