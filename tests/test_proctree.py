"""labkit.proctree: the processes below one, read from /proc."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit import proctree

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


def test_a_grandchild_is_below_its_grandparent_and_the_table_holds_resident_pages():
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(30)'])"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(200):  # until the grandchild exists
            procs = proctree.table()
            found = proctree.below(child.pid, procs)
            if found:
                break
            time.sleep(0.05)
        assert len(found) == 1 and procs[found[0]][0] == child.pid
        assert child.pid in proctree.below(os.getpid(), procs) and procs[os.getpid()][1] > 0
        assert proctree.below(found[0], procs) == [] and os.getpid() not in proctree.below(child.pid, procs)
    finally:
        for pid in proctree.below(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()


def test_cpu_seconds_counts_every_process_below_their_exited_threads_and_reaped_children_but_not_sleep():
    """A child that, once ready, runs a thread of 0.2 s of CPU that exits, a child of 0.2 s it reaps, and a grandchild
    of 0.2 s still alive, then sleeps: 0.6 s of CPU (and the two pythons' starts) between the two readings."""
    burn = "import time\nwhile time.process_time() < 0.2: pass\n"
    code = ("import subprocess, sys, threading, time\n"
            "print('ready', flush=True); sys.stdin.readline()\n"
            "def spin():\n    t0 = time.thread_time()\n    while time.thread_time() - t0 < 0.2: pass\n"
            "t = threading.Thread(target=spin); t.start(); t.join()\n"
            f"subprocess.run([sys.executable, '-S', '-c', {burn!r}])\n"
            f"p = subprocess.Popen([sys.executable, '-S', '-c', {burn + 'print(1, flush=True); time.sleep(60)'!r}],"
            " stdout=subprocess.PIPE)\n"
            "p.stdout.readline(); time.sleep(0.5); print('done', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        before = proctree.cpu_seconds(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        spent = proctree.cpu_seconds(child.pid) - before
        assert 0.58 <= spent < 1.0, spent  # (the reaped child counts to the clock tick: user, system)
        assert proctree.cpu_seconds(2**22 + 12345) == 0.0  # no such process: nothing
    finally:
        for pid in proctree.below(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()
