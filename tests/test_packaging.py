"""pyproject.toml, the locks and environment.yml agree; a venv course.py made holds exactly the locked versions."""
import json
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "locks"
sys.path.insert(0, str(ROOT))
import course  # noqa: E402  (the README's entry point, a script at the top of the course)


def pip_requirements() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {canonicalize_name(Requirement(d).name): Requirement(d) for d in deps}


def lock_inputs(path: Path) -> dict[str, Requirement]:
    """The requirements a lock's .in file names (following -r)."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            found.update(lock_inputs(path.parent / line[3:].strip()))
        elif line.startswith("-c "):  # a constraint (book.in holds its pins to course.txt's), not a requirement
            continue
        elif line:
            req = Requirement(line)
            found[canonicalize_name(req.name)] = req
    return found


def locked(path: Path, env: dict | None = None) -> dict[str, str]:
    """name -> version a hashed lock pins for this interpreter and platform (markers evaluated)."""
    env = env or default_environment()
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$", line)
        if m:
            req = Requirement(f"{m.group(1)}=={m.group(2)}" + (f"; {m.group(3)}" if m.group(3) else ""))
            if req.marker is None or req.marker.evaluate(env):
                out[canonicalize_name(req.name)] = m.group(2)
    return out


def environment() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def test_the_lock_input_is_pyprojects_list_less_torch_and_triton_with_the_same_bounds():
    pip, lock_in = pip_requirements(), lock_inputs(LOCKS / "course.in")
    for name, req in pip.items():
        if name in ("torch", "triton"):
            assert name not in lock_in, f"{name} is pinned in locks/torch.toml, not locks/course.in"
            continue
        assert name in lock_in, f"{name} is in pyproject.toml but not in locks/course.in"
        assert lock_in[name].specifier == req.specifier, (f"{name}: pyproject {req.specifier} "
                                                          f"vs lock {lock_in[name].specifier}")


def assert_hashed(lock: Path) -> None:
    blocks = re.split(r"\n(?=[A-Za-z0-9])", lock.read_text().split("\n", 1)[1])
    for block in blocks:
        if "==" in block.splitlines()[0]:
            assert "--hash=sha256:" in block, f"{lock.name}: no hash for {block.splitlines()[0]}"


def test_every_locked_pin_has_a_hash_and_satisfies_pyproject():
    assert_hashed(LOCKS / "course.txt")
    pins = locked(LOCKS / "course.txt")
    for name, req in pip_requirements().items():
        if name not in ("torch", "triton"):
            assert req.specifier.contains(pins[name]), f"the lock's {name} {pins[name]} is outside pyproject's {req}"


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_the_conda_lock_is_the_course_lock_plus_the_cpu_pair(python):
    env = {**default_environment(), "python_version": python, "python_full_version": f"{python}.0"}
    course_pins, conda_pins = locked(LOCKS / "course.txt", env), locked(LOCKS / "conda.txt", env)
    assert {k: v for k, v in conda_pins.items() if k in course_pins} == course_pins
    pair = course.torch_pair("cpu")
    assert conda_pins["torch"] == pair["torch"]
    if env["platform_system"] == "Linux":
        assert conda_pins["triton"] == pair["triton"]


def test_torch_pairs_are_within_pyprojects_ranges():
    pip = pip_requirements()
    for kind in ("cpu", "cuda"):
        pair = course.torch_pair(kind)
        assert pip["torch"].specifier.contains(pair["torch"]) and pip["triton"].specifier.contains(pair["triton"])


def test_environment_yml_installs_the_conda_lock_with_conda_forge_python_only():
    env = environment()
    assert env["channels"] == ["conda-forge"] and env["name"] == "gpu-course"
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    assert sorted(re.match(r"[a-z]+", d).group(0) for d in conda) == ["pip", "python"]
    assert [d["pip"] for d in env["dependencies"] if isinstance(d, dict)] == [["-r locks/conda.txt"]]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert next(d for d in conda if d.startswith("python")).replace("python", "") == requires
    assert "pip install --no-deps -e ." in (ROOT / "README.md").read_text()


def test_triton_only_where_it_exists():
    triton = pip_requirements()["triton"]
    assert triton.marker is not None
    assert triton.marker.evaluate({"platform_system": "Linux"})
    assert not triton.marker.evaluate({"platform_system": "Darwin"})
    assert not triton.marker.evaluate({"platform_system": "Windows"})


def test_core_packages_are_all_there():
    assert ({"jupyterlab", "torch", "triton", "matplotlib", "ipywidgets", "nbval", "papermill"}
            <= set(pip_requirements()))


def test_labkit_console_command_is_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["labkit"] == "labkit.cli:main"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(python3 course\.py \w+)", readme, flags=re.M)
    assert commands[:2] == ["python3 course.py start", "python3 course.py test"]
    assert "python3 course.py test" in (ROOT / ".ci" / "run").read_text()


def _venv_record() -> dict | None:
    """What course.py installed into the venv running this test (None: not a venv course.py made)."""
    stamp = Path(sys.prefix) / ".installed"
    if Path(sys.prefix).resolve() != course.VENV.resolve() or not stamp.is_file():
        return None
    try:
        return json.loads(stamp.read_text())
    except ValueError:
        return None


def test_a_venv_from_the_lock_holds_exactly_the_locked_versions():
    record = _venv_record()
    if record is None or str(record.get("lock", "")).startswith("unlocked"):
        pytest.skip(f"not running in a venv course.py made from the lock ({sys.prefix})")
    wanted = locked(LOCKS / "course.txt")
    if record.get("torch_from") == "cpu":
        pair = course.torch_pair("cpu")
        wanted["torch"] = pair["torch"]
        if sys.platform.startswith("linux"):
            wanted["triton"] = pair["triton"]
    have = {}
    for name in wanted:
        try:
            have[name] = version(name).split("+")[0]
        except PackageNotFoundError:
            have[name] = None
    print("\n" + ", ".join(f"{n} {have[n]}" for n in sorted(wanted) if n in ("torch", "triton", "jupyterlab", "nbval")))
    wrong = {n: (have[n], v) for n, v in wanted.items() if have[n] != v}
    assert not wrong, f"installed versions differ from the lock (installed, locked): {wrong}"


def book_requirements() -> dict[str, Requirement]:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["book"]
    return {canonicalize_name(Requirement(d).name): Requirement(d) for d in extra}


def test_the_book_lock_is_pyprojects_book_extra_hashed_within_its_bounds():
    extra, book_in = book_requirements(), lock_inputs(LOCKS / "book.in")
    assert {n: str(r.specifier) for n, r in book_in.items()} == {n: str(r.specifier) for n, r in extra.items()}
    assert "-c course.txt" in (LOCKS / "book.in").read_text()
    assert_hashed(LOCKS / "book.txt")
    pins = locked(LOCKS / "book.txt")
    for name, req in extra.items():
        assert req.specifier.contains(pins[name]), f"the book lock's {name} {pins[name]} is outside pyproject's {req}"
    assert set(course.BOOK_NEEDED) == set(__import__("labkit.tools.book", fromlist=["TOOLS"]).TOOLS)


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_the_book_lock_changes_none_of_the_course_locks_versions(python):
    """course.py installs locks/book.txt after locks/course.txt (--no-deps): a package both pin must agree."""
    env = {**default_environment(), "python_version": python, "python_full_version": f"{python}.0"}
    course_pins, book_pins = locked(LOCKS / "course.txt", env), locked(LOCKS / "book.txt", env)
    shared = set(course_pins) & set(book_pins)
    assert len(shared) > 10  # jinja2, nbformat, ipykernel...: the lock was compiled against course.txt
    assert {k: book_pins[k] for k in shared} == {k: course_pins[k] for k in shared}
