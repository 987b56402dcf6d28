"""A test that switches the device, the Triton interpreter or the environment leaves no trace for the next one.

On a GPU host, one CPU-mode test used to leave TRITON_INTERPRET=1 behind, and a later GPU test then
ran its kernel in the interpreter. conftest.py's autouse fixture restores that state; these tests run
a small suite with it (and without it, to show the check can fail) in a child pytest.
"""
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.paths import child_env

ROOT = Path(__file__).resolve().parent.parent

CHANGES = '''
import os, sys
import torch
import labkit

def test_changes_the_process():
    os.environ["TRITON_INTERPRET"] = "0" if os.environ.get("TRITON_INTERPRET") == "1" else "1"
    os.environ["LABKIT_LEFT_BEHIND"] = "1"
    os.environ.pop("LABKIT_CACHE")
    labkit.setup(device="cpu", quick=False)
    torch.set_default_dtype(torch.float64)
    torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32
    from triton.runtime import interpreter
    original = interpreter._patch_lang_tensor
    def patched(tensor, scope):
        return original(tensor, scope)
    patched.labkit_fixed, patched.labkit_original = True, original
    interpreter._patch_lang_tensor = patched
'''

SEES = '''
import os, sys
import torch
import labkit

ENV = dict(os.environ)  # as collection found it: after conftest, before any test ran
SETUP = labkit.current()
TF32 = torch.backends.cuda.matmul.allow_tf32
HOOK = getattr(sys.modules.get("triton.runtime.interpreter"), "_patch_lang_tensor", None)

def test_sees_the_process_as_it_was():
    assert {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"} == \\
        {k: v for k, v in ENV.items() if k != "PYTEST_CURRENT_TEST"}
    assert labkit.current() is SETUP
    assert torch.get_default_dtype() == torch.float32
    assert torch.backends.cuda.matmul.allow_tf32 == TF32
    interpreter = sys.modules.get("triton.runtime.interpreter")
    if interpreter is not None:
        now = interpreter._patch_lang_tensor
        assert now is HOOK if HOOK is not None else not getattr(now, "labkit_fixed", False)
'''


def run_suite(tmp_path: Path, conftest: str, *order: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_a_changes.py").write_text(CHANGES)
    (tmp_path / "test_b_sees.py").write_text(SEES)
    env = child_env(ROOT)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *order]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_test_that_changes_device_env_and_triton_leaves_nothing_behind(tmp_path):
    pytest.importorskip("triton")
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    done = run_suite(tmp_path, conftest, "test_a_changes.py", "test_b_sees.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]

    # without the fixture the same order fails: the check above can fail
    (tmp_path / "without").mkdir()
    bare = conftest.replace("@pytest.fixture(autouse=True)\ndef restore_global_state", "def restore_global_state")
    assert bare != conftest
    done = run_suite(tmp_path / "without", bare, "test_a_changes.py", "test_b_sees.py")
    assert done.returncode == 1 and "1 failed, 1 passed" in done.stdout, done.stdout[-3000:]


def test_shuffled_order_is_available_and_declared():
    pytest.importorskip("random_order", reason="pytest-random-order is not installed here")
    text = (ROOT / "pyproject.toml").read_text() + (ROOT / "locks" / "course.in").read_text()
    assert text.count("pytest-random-order") == 2
    assert "pytest-random-order==" in (ROOT / "locks" / "course.txt").read_text()
