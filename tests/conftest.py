"""Shared test set-up: labkit decides the device (and the Triton interpreter) before any test imports triton."""
import os
import tempfile

os.environ.setdefault("LABKIT_CACHE", tempfile.mkdtemp(prefix="labkit-test-cache-"))
# `labkit grade` stores outcomes by the code graded (labkit/grading/memo.py): off here, so that every test that
# grades measures what it grades (tests/test_grade_memo.py turns the store on where it tests it)
os.environ.setdefault("LABKIT_GRADE_MEMO", "off")
if "MPLBACKEND" not in os.environ:  # Agg for this process only: nbval's kernels keep the inline backend
    import matplotlib

    matplotlib.use("Agg")

import labkit  # noqa: E402

labkit.setup()


# --- every test leaves the process as it found it (tests run shuffled too: pytest --random-order) ---
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from labkit import device as _device  # noqa: E402


def _triton_patch():
    """The Triton interpreter's tensor hook (labkit.setup() mends it for old Triton on the CPU), if loaded."""
    mod = sys.modules.get("triton.runtime.interpreter")
    return mod, getattr(mod, "_patch_lang_tensor", None)


def _clear_kernel_plans() -> None:
    common = sys.modules.get("labkit.kernels._common")  # (not imported here: that would import triton)
    if common is not None and hasattr(common, "clear_plans"):
        common.clear_plans()


@pytest.fixture(autouse=True)
def restore_global_state():
    """Undo what a test did to the environment (TRITON_INTERPRET, LABKIT_*), labkit's device, torch's
    defaults and the Triton interpreter: a CPU-mode test must not turn a GPU host's later kernels into
    interpreted ones."""
    env = dict(os.environ)
    setup = _device._current
    torch_state = (torch.get_default_dtype(), torch.get_num_threads(), torch.get_float32_matmul_precision(),
                   torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    gpu = torch.cuda.current_device() if torch.cuda.is_initialized() else None
    _, hook = _triton_patch()
    _clear_kernel_plans()  # a test that patches a kernel's tuning table must get plans made from it
    yield
    _clear_kernel_plans()
    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if os.environ.get(k) != v})
    _device._current = setup
    torch.set_default_dtype(torch_state[0])
    torch.set_num_threads(torch_state[1])
    torch.set_float32_matmul_precision(torch_state[2])
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = torch_state[3:]
    if gpu is not None:
        torch.cuda.set_device(gpu)
    mod, now = _triton_patch()
    if mod is not None and now is not hook:
        while hook is None and getattr(now, "labkit_original", None) is not None:  # unwrap every patch
            now = now.labkit_original
        mod._patch_lang_tensor = hook if hook is not None else now


# --- tools a machine may lack: one rule everywhere ---
# A test of something a tool provides (the sandbox, a browser, nvcc) is skipped where the tool is missing, with the
# reason in the summary (course.py test passes -rs). A test that only needs the grader to run (its logic, its
# scores) runs everywhere: inside bubblewrap where it can sandbox here, else with the grader's explicit fallback
# --unsafe-no-sandbox, which the run's header names.
_sandbox_problem: list = []


def sandbox_problem() -> str | None:
    """Why bubblewrap cannot sandbox the grader on this machine (None: it can); checked once per run."""
    if not _sandbox_problem:
        from labkit.grading import sandbox
        _sandbox_problem.append(sandbox.problem())
    return _sandbox_problem[0]


@pytest.fixture(scope="session")
def grader_sandbox_flags() -> list[str]:
    """The flags every test that runs `labkit grade` passes: none with a sandbox, else the explicit fallback."""
    return [] if sandbox_problem() is None else ["--unsafe-no-sandbox"]


def pytest_report_header(config) -> str:
    why = sandbox_problem()
    return ("grader tests: inside the bubblewrap sandbox" if why is None else
            f"grader tests: without a sandbox (--unsafe-no-sandbox), and its own tests skipped: {why.split(':')[0]}")


# --- what is committed, not what a student's JupyterLab saved over it ---
def committed_text(path) -> str:
    """A file as git's index holds it (what a commit would contain), else as it is on disk (not a checkout, or
    untracked): running the notebooks in JupyterLab saves outputs into the work tree, and the tests that check
    committed notebooks must not fail on a student's checkout for that."""
    import subprocess
    from pathlib import Path

    path = Path(path).resolve()
    done = subprocess.run(["git", "show", f":./{path.name}"], cwd=path.parent, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else path.read_text()


# --- Triton kernel tests (labkit/kernels) ---
# bf16 keeps 8 significant bits: rounded to nearest, a result is within 2^-9 (0.2%) of exact; fp32 math inside a
# kernel adds a little. (Triton's interpreter truncated instead, one unit low in a quarter of elements; setup()
# fixes it.)
KERNEL_TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 6e-3}


@pytest.fixture
def poison_outputs(monkeypatch):
    """Make torch.empty / empty_like / empty_strided return NaN-filled floats, so unwritten output elements fail."""
    def poisoned(make):
        def wrapper(*args, **kwargs):
            t = make(*args, **kwargs)
            if t.is_floating_point():
                t.fill_(float("nan"))
            return t
        return wrapper
    for name in ("empty", "empty_like", "empty_strided"):
        monkeypatch.setattr(torch, name, poisoned(getattr(torch, name)))


@pytest.fixture
def close64():
    """assert_close against a float64 reference with a tolerance fit for `out`'s dtype."""
    def check(out, ref, dtype=None, scale=1.0, atol=None):
        # atol: an absolute floor of its own, for outputs much smaller than 1 (the default floor is the rtol)
        tol = KERNEL_TOL[dtype or out.dtype] * scale
        assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
        assert not torch.isnan(out).any(), "output holds NaN (an element left unwritten?)"
        torch.testing.assert_close(out.double(), ref.double(), rtol=tol, atol=tol if atol is None else atol)
    return check


# --- one run of the notebooks answers both questions: do the claims hold, and can each fail? ---
# The notebook tests (nbval) run every notebook; with LABKIT_CLAIMS_LOG set, labkit.claim also logs the verdict each
# claim's inverted test gets on the same figures (labkit/claims.py). tests/test_claims_can_fail.py reads that log
# after the notebooks ran (it is moved last) instead of running every notebook again with LABKIT_CLAIMS_INVERT=1;
# run without the notebooks, it runs them inverted itself.
_OWN_LOG = "LABKIT_CLAIMS_LOG" not in os.environ
CLAIMS_LOG = os.environ.setdefault("LABKIT_CLAIMS_LOG", tempfile.mkdtemp(prefix="labkit-claims-log-"))
NOTEBOOK_RUNS: dict = {}  # notebook path -> "ok", or the first failure of one of its cells


def pytest_sessionfinish(session, exitstatus):
    if _OWN_LOG:
        import shutil

        shutil.rmtree(CLAIMS_LOG, ignore_errors=True)


# --- two worker processes (pytest-xdist; course.py test starts them on a machine without a GPU, --dist loadfile) ---
# Each file goes to one worker whole; the course's notebooks and tests/test_claims_can_fail.py, which reads the claims
# they log (below), go to one worker together, as one scope.
LOG_BOUND_SCOPE = "course-notebooks"


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from pathlib import Path

    from xdist.scheduler import LoadFileScheduling

    from labkit.paths import course_notebooks

    root = config.rootpath.resolve()
    readers = Path(__file__).resolve().with_name("test_claims_can_fail.py")
    bound = {str(p.resolve().relative_to(root)) for p in [*course_notebooks(), readers]}

    class CourseScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return LOG_BOUND_SCOPE if path in bound else path

    return CourseScheduling(config, log)


def pytest_collection_modifyitems(session, config, items):
    """Name each notebook to its kernel (LABKIT_NOTEBOOK, read by the claims log), note which notebooks failed a
    cell, and run the tests that read the log after every notebook."""
    from pathlib import Path

    for item in items:
        parent = item.parent
        if type(parent).__name__ != "IPyNbFile":
            continue
        path = str(Path(str(parent.path)).resolve())
        if path not in NOTEBOOK_RUNS:  # its first cell: the notebook's kernel starts in its set-up
            NOTEBOOK_RUNS[path] = "not run"
            parent.setup = _named_setup(path, parent.setup)
        item.runtest = _noted_runtest(path, item, item.runtest)
    last = [i for i in items if "inverted" in getattr(i, "fixturenames", ())]
    items[:] = [i for i in items if "inverted" not in getattr(i, "fixturenames", ())] + last


def _named_setup(path: str, setup):
    def named():
        os.environ["LABKIT_NOTEBOOK"] = path  # the kernel starts now, with this environment
        try:
            setup()
        except BaseException as e:
            NOTEBOOK_RUNS[path] = f"kernel set-up: {type(e).__name__}: {str(e)[:300]}"
            raise
        finally:
            os.environ.pop("LABKIT_NOTEBOOK", None)
        NOTEBOOK_RUNS[path] = "ok"
    return named


def _noted_runtest(path: str, item, runtest):
    def noted():
        try:
            runtest()
        except BaseException as e:
            if NOTEBOOK_RUNS.get(path) == "ok":
                NOTEBOOK_RUNS[path] = f"{item.name}: {type(e).__name__}: {str(e)[:300]}"
            raise
    return noted
