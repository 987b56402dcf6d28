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
