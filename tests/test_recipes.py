"""CONTRIBUTING.md's recipes, followed step by step on a toy, in a copy of the course.

The toys live in tests/recipes/. Each test copies what the recipe touches into a temporary course
folder, makes the recipe's edits there and runs what the recipe says to run, in a subprocess.
"""
import csv
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from labkit.paths import child_env

ROOT = Path(__file__).resolve().parent.parent
TOYS = ROOT / "tests" / "recipes"


def course_copy(tmp: Path, *parts: str) -> Path:
    """tmp/course with labkit/ and the given files or folders of the course."""
    course = tmp / "course"
    for part in ("labkit", *parts):
        src, dest = ROOT / part, course / part
        if src.is_dir():
            shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dest)
    return course


def run(course: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = child_env(course, LABKIT_QUICK="1")
    done = subprocess.run([sys.executable, *args], cwd=course, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def insert_after(path: Path, anchor: str, text: str) -> None:
    """Add `text` right after the first occurrence of `anchor` in the file."""
    s = path.read_text()
    assert anchor in s, f"{anchor!r} not in {path}"
    path.write_text(s.replace(anchor, anchor + text, 1))


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*.py")):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def toy_solution_notebook() -> dict:
    cells = [nbformat.v4.new_markdown_cell("# Exercise 99: a toy\nDouble a tensor; write an expression."),
             nbformat.v4.new_code_cell("device = None\nquick = None"),
             nbformat.v4.new_code_cell("import torch\n\nimport labkit\nfrom labkit import check\n\n"
                                       "cfg = labkit.setup(device=device, quick=quick)"),
             nbformat.v4.new_code_cell("def double(x):\n    # BEGIN SOLUTION\n    # HINT: twice x\n"
                                       "    return x * 2\n    # END SOLUTION"),
             nbformat.v4.new_code_cell("check.double(double)"),
             nbformat.v4.new_code_cell('def triple_source():\n    # BEGIN SOLUTION\n    return "x * 3"\n'
                                       "    # END SOLUTION"),
             nbformat.v4.new_code_cell("check.triple_source(triple_source)")]
    cells[1].metadata["tags"] = ["parameters"]
    return nbformat.v4.new_notebook(cells=cells)


def test_add_an_exercise_with_hidden_cases_and_grade_it_without_touching_the_grader(tmp_path, grader_sandbox_flags):
    course = course_copy(tmp_path)
    grader_before = digest(course / "labkit" / "grading")
    # 1. the solution notebook
    (course / "solutions" / "graded").mkdir(parents=True)
    nbformat.write(toy_solution_notebook(), course / "solutions" / "99_toy.ipynb")
    # 2. the public module; 3. registered
    shutil.copy(TOYS / "ex99_toy.py", course / "labkit" / "exercises" / "ex99_toy.py")
    init = course / "labkit" / "exercises" / "__init__.py"
    insert_after(init, "ex08_data_parallel)", "\nfrom labkit.exercises import ex99_toy  # noqa: E402")
    insert_after(init, "    ex08_data_parallel,\n", "    ex99_toy,\n")
    # 4. the private twin
    shutil.copy(TOYS / "graded_99_toy.py", course / "solutions" / "graded" / "99_toy.py")
    # 5. build, check, grade
    run(course, "-m", "labkit.cli", "exercises", "build")
    assert (course / "exercises" / "99_toy.ipynb").exists()
    out = run(course, "-c", "import labkit; labkit.setup(device='cpu'); from labkit import check; "
                            "assert check.double(lambda x: x * 2); assert not check.double(lambda x: x + 2)").stdout
    assert "✓ double" in out and "elements differ" in out
    subs = tmp_path / "subs"
    for student, folder in (("solution", "solutions"), ("exercise", "exercises")):
        (subs / student).mkdir(parents=True)
        shutil.copy(course / folder / "99_toy.ipynb", subs / student)
    run(course, "-m", "labkit.cli", "grade", str(subs), "--out", str(tmp_path / "out"), "--device", "cpu",
        "--timeout", "60", *grader_sandbox_flags)
    with open(tmp_path / "out" / "grades.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert rows["solution"]["double"] == "2" and rows["solution"]["triple_source"] == "1"
    assert rows["solution"]["total"] == rows["solution"]["out_of"] == "3"
    assert rows["exercise"]["total"] == "0"
    assert "not done yet" in (tmp_path / "out" / "feedback" / "exercise.md").read_text()
    assert digest(course / "labkit" / "grading") == grader_before


def test_add_a_kernel_test_it_and_bench_it(tmp_path):
    course = course_copy(tmp_path, "tests/conftest.py")
    # 1. the kernel module, with its bench cases
    shutil.copy(TOYS / "toy_scale.py", course / "labkit" / "kernels" / "toy_scale.py")
    # 2. one line in KERNELS: the import, kernels.toy_scale, its attributes, BENCHMARKED and modules() follow
    init = course / "labkit" / "kernels" / "__init__.py"
    insert_after(init, '    "attention": "attention",\n', '    "toy_scale": "toy_scale",\n')
    run(course, "-c", "from labkit import kernels\n"
        "assert kernels.modules()['toy_scale'].__name__ == 'labkit.kernels.toy_scale'\n"
        "assert kernels.toy_scale.min_bytes(10) == 80 and kernels.toy_scale.reference is not None\n"
        "assert list(kernels.BENCHMARKED)[-1] == 'toy_scale'")
    # 3. its test, then bench it
    shutil.copy(TOYS / "toy_scale_tests.py", course / "tests" / "test_kernels_toy_scale.py")
    run(course, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_kernels_toy_scale.py")
    out = run(course, "-m", "labkit.cli", "bench", "toy_scale", "--save", str(tmp_path / "b")).stdout
    assert "toy_scale  (rate from the minimum bytes/FLOPs" in out
    assert json.loads((tmp_path / "b.json").read_text())["rows"][0]["kernel"] == "toy_scale"


def test_add_a_notebook_that_passes_the_notebook_rules_and_runs(tmp_path):
    # the course's own notebooks are left out: the rules are checked on the new one alone
    course = course_copy(tmp_path, "tests/test_notebooks.py", "tests/conftest.py")
    (course / "notebooks").mkdir()
    index = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# The course\n\n| # | notebook |\n|-|-|")])
    # 1-2. written in jupytext percent format, converted
    run(course, "-m", "jupytext", "--to", "ipynb", "--set-kernel", "python3", "--output",
        "notebooks/99_toy.ipynb", str(TOYS / "99_toy.py"))
    # 3. linked from the index, in order
    index.cells[0].source += "\n| 99 | [A toy](99_toy.ipynb) |"
    nbformat.write(index, course / "notebooks" / "index.ipynb")
    # 4. the notebook rules, and a quick run
    run(course, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_notebooks.py")
    run(course, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env",
        "notebooks/99_toy.ipynb")


def test_add_a_torchrun_lab_and_launch_it_on_two_processes(tmp_path):
    course = course_copy(tmp_path)
    shutil.copy(TOYS / "toy_allsum.py", course / "labkit" / "parallel" / "toy_allsum.py")
    done = run(course, "-c", "from labkit.parallel import launch\n"
               "r = launch.torchrun('labkit.parallel.toy_allsum', 2, [], echo=False, timeout=300)\n"
               "assert r['sum'] == 3.0 and r['world_size'] == 2 and r['backend'] == 'gloo', r\n"
               "print('ok')")
    assert done.stdout.strip().endswith("ok")


def test_add_a_labkit_verb(tmp_path):
    course = course_copy(tmp_path)
    shutil.copy(TOYS / "toy_hello.py", course / "labkit" / "tools" / "hello.py")
    insert_after(course / "labkit" / "cli.py", "COMMANDS: dict[str, tuple[str, str]] = {\n",
                 '    "hello": ("labkit.tools.hello", "greet someone"),\n')
    assert run(course, "-m", "labkit.cli", "hello", "Ada").stdout.strip() == "hello, Ada"
    assert "greet someone" in run(course, "-m", "labkit.cli", "--help").stdout


def test_add_a_cuda_c_kernel_to_notebook_06_s_extension(tmp_path):
    """The nvcc path: the .cu file, its launcher in the header, KERNEL_FILES, the binding; then the compile tests
    (every listed file compiles for sm_90 and sm_75; every launcher is defined and bound)."""
    if shutil.which("nvcc") is None:
        import pytest
        pytest.skip("nvcc (the CUDA compiler) is not on PATH")
    course = course_copy(tmp_path, "tests/test_cuda_compile.py", "tests/conftest.py")
    cuda_dir = course / "labkit" / "cuda"
    shutil.copy(TOYS / "toy_negate.cu", cuda_dir / "toy_negate.cu")
    insert_after(cuda_dir / "labkit_cuda.cuh", "namespace labkit {\n",
                 "\n// out[i] = -x[i] for i < n.  (toy_negate.cu)\n"
                 "cudaError_t launch_negate(const float* x, float* out, int64_t n, cudaStream_t stream);\n")
    insert_after(cuda_dir / "__init__.py", 'KERNEL_FILES = ("vector_add.cu", ', '"toy_negate.cu", ')
    insert_after(cuda_dir / "binding.cpp", "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n",
                 '    m.def("negate", &negate, "out = -x", pybind11::arg("x"));\n')
    binding = cuda_dir / "binding.cpp"
    binding.write_text(binding.read_text().replace(
        "torch::Tensor vector_add(torch::Tensor x, torch::Tensor y) {",
        "torch::Tensor negate(torch::Tensor x) {\n    check_tensor(x, \"x\");\n"
        "    const c10::cuda::CUDAGuard guard(x.device());\n    auto out = torch::empty_like(x);\n"
        "    check_launch(labkit::launch_negate(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(),\n"
        "                                       c10::cuda::getCurrentCUDAStream().stream()), \"negate\");\n"
        "    return out;\n}\n\ntorch::Tensor vector_add(torch::Tensor x, torch::Tensor y) {", 1))
    out = run(course, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda_compile.py",
              "-k", "toy_negate or declared_defined_and_bound or each_launch_is_checked").stdout
    assert "3 passed" in out, out
