"""labkit/grading/keeper.py: without a sandbox, what a student's process detaches stays in the grader's tree."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from labkit import proctree
from labkit.grading import sandbox, supervise

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper is Linux's")

# Detaches a sleeper (a double fork into a session of its own, as a daemon does), writes its pid, then sleeps
# `main_s` and exits 3.
DETACH = """
import os, sys, time
pid_file, main_s = sys.argv[1], float(sys.argv[2])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # the sleeper writes its pid (exec keeps it), then becomes `sleep`
        with open(pid_file + '.tmp', 'w') as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + '.tmp', pid_file)
        os.execv('/bin/sleep', ['sleep', '300'])
    os._exit(0)
os.wait()
while not os.path.exists(pid_file):
    time.sleep(0.01)
time.sleep(main_s)
sys.exit(3)
"""


def _wait_for(path, timeout=20.0):
    end = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < end, f"{path} was not written"
        time.sleep(0.02)
    return int(path.read_text())


def _alive(pid: int) -> bool:
    try:
        return proctree._stat(pid)[0] != b"Z"
    except OSError:
        return False


def _ends(alive, within: float = 5.0) -> bool:
    """Whether `alive()` turns false within `within` s. A SIGKILL ends a process once the kernel has run its exit,
    which on a loaded machine can come a little after the kill returned (CI saw one still alive just after); a
    process nobody killed runs on for its 300 s."""
    end = time.monotonic() + within
    while alive():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_a_detached_process_stays_below_the_keeper_and_ends_with_the_command(tmp_path):
    script, pid_file = tmp_path / "detach.py", tmp_path / "pid"
    script.write_text(DETACH)
    keeper = subprocess.Popen([sys.executable, "-I", str(sandbox.KEEPER), sys.executable, str(script),
                               str(pid_file), "1.5"])
    sleeper = _wait_for(pid_file)
    try:
        assert sleeper in proctree.below(keeper.pid)  # adopted: stopped, counted and killed with the rest
        assert keeper.wait(timeout=30) == 3  # the command's own exit code
        assert _ends(lambda: _alive(sleeper))  # what it left was killed when it ended
    finally:
        if _alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)


def test_without_the_keeper_a_detached_process_leaves_the_tree(tmp_path):
    # what the keeper is for: run bare, the sleeper is init's (or another reaper's), outside the tree
    script, pid_file = tmp_path / "detach.py", tmp_path / "pid"
    script.write_text(DETACH)
    bare = subprocess.Popen([sys.executable, str(script), str(pid_file), "30"])
    sleeper = _wait_for(pid_file)
    try:
        assert sleeper not in proctree.below(bare.pid)
    finally:
        bare.kill()
        bare.wait()
        os.kill(sleeper, signal.SIGKILL)


@pytest.mark.parametrize("code, rc", [("raise SystemExit(0)", 0), ("raise SystemExit(5)", 5),
                                      ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM)])
def test_the_keeper_exits_as_its_command_did(code, rc):
    run = subprocess.run([sys.executable, "-I", str(sandbox.KEEPER), sys.executable, "-c", code], check=False)
    assert sandbox.NoSandbox.exit_code(run.returncode) == rc  # 128 + N for signal N, as Popen would say -N


def test_a_process_the_grader_stops_takes_what_it_detached_along(tmp_path):
    # Without a sandbox: the student's process runs past its budget and is killed; the process it detached is
    # killed with it (before, killing the process group left it running: it has a session of its own).
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    pid_file = tmp_path / "pid"
    (pkg / "detacher.py").write_text(textwrap.dedent(f"""
        import sys
        sys.argv = [sys.argv[0], {str(pid_file)!r}, "300"]
        exec(open({str(tmp_path / 'detach.py')!r}).read())
    """))
    (tmp_path / "detach.py").write_text(DETACH)
    run, work = tmp_path / "run", tmp_path / "work"
    (run / "in").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(pkg)}
    box = sandbox.NoSandbox()
    box.scratch_for(work)
    events, killed, _ = supervise.launch(box, "detacher", run, work, env, supervise.Limits(4096, 1), budget=8,
                                         nb_timeout=None, key="k" * 64)
    sleeper = int(pid_file.read_text())
    try:
        assert killed and "timed out" in killed
        assert _ends(lambda: _alive(sleeper))
    finally:
        if _alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)


MARK = "labkit-keeper-test-5d1c"  # in the command line of the process the submission detaches
DETACH_CELL = f"""
import ctypes, os
libc = ctypes.CDLL(None)  # (libc's fork and exec: outside the audit hook's view, as a determined student does)
if libc.fork() == 0:
    libc.setsid()
    if libc.fork() == 0:
        argv = (ctypes.c_char_p * 4)(b"/bin/sh", b"-c", b"sleep 300; : {MARK}", None)
        libc.execv(b"/bin/sh", argv)
    os._exit(0)
"""


def _marked() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and MARK.encode() in open(f"/proc/{entry}/cmdline", "rb").read():
                found.append(int(entry))
        except OSError:
            continue
    return found


def test_a_graded_notebook_that_detaches_a_process_leaves_nothing_running(tmp_path):
    # A whole grading without a sandbox: the notebook detaches a long sleeper (a double fork, its own session)
    # and finishes; the sleeper ends with the grading, and the student still gets a row.
    import csv
    import json

    from labkit.grading.cli import GradeConfig, grade
    from labkit.paths import COURSE_ROOT

    nb = json.loads((COURSE_ROOT / "solutions" / "04_roofline.ipynb").read_text())
    nb["cells"].append({"cell_type": "code", "id": "detach", "metadata": {}, "outputs": [], "execution_count": None,
                        "source": DETACH_CELL})
    (tmp_path / "subs" / "daemon").mkdir(parents=True)
    (tmp_path / "subs" / "daemon" / "04_roofline.ipynb").write_text(json.dumps(nb))
    try:
        grade(GradeConfig(tmp_path / "subs", tmp_path / "out", device="cpu", only=["04_roofline"], timeout=120,
                          workers=1, memo="off", unsafe_no_sandbox=True))
        assert _ends(_marked), "a process the notebook detached outlived its grading"
        with open(tmp_path / "out" / "grades.csv", newline="") as f:
            assert [r["student"] for r in csv.DictReader(f)] == ["daemon"]
    finally:
        for pid in _marked():
            os.kill(pid, signal.SIGKILL)
