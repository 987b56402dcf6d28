"""`labkit grade` in its bubblewrap sandbox against hostile submissions, one grader run for all of them.

Every hostile student submits an exercise stub (worth 0) plus code that attacks the grader: processes
started outside Python's audited calls, signals to the grader, files reached through a directory fd,
torch.from_file, links made at run time or relative paths; writes to the course, the graded tests,
another student's notebook and earlier grade files; forged results and events and an event flood;
/dev/shm files; links, FIFOs and name collisions among the submissions; a constant for the timing
exercise and a Triton stub that never runs; what the parent must not trust (issue 40): a 1,500-deep
folder chain made in the results folder, /tmp and the submission, a 255-character name, a formula as a
name, a hidden folder, a 50 MB cell output, two edited notebooks, /tmp filled past the memory limit,
100,000 files in /tmp, 70 MB printed. None may gain a point, change a file outside the grader's own
output, or change an honest student's grade, and the batch must complete.
"""
import csv
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.grading import merge, safeio, sandbox, submissions
from labkit.paths import child_env

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"
MARK = "labkit-hostile-7f3a"  # in the command line of every process a hostile student starts

WHY_NOT = sandbox.problem()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"no sandbox here: {WHY_NOT}")


def nb(name: str, folder: Path = SOLUTIONS) -> dict:
    return json.loads((folder / f"{name}.ipynb").read_text())


def src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def with_cell(notebook: dict, code: str) -> dict:
    """`notebook` with a code cell holding `code` after the labkit.setup cell."""
    i = next(i for i, c in enumerate(notebook["cells"]) if "labkit.setup(" in src(c))
    notebook["cells"].insert(i + 1, {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                                     "source": code, "id": f"hostile{i}"})
    return notebook


def edit(notebook: dict, old: str, new: str) -> dict:
    hits = [c for c in notebook["cells"] if c["cell_type"] == "code" and old in src(c)]
    assert len(hits) == 1, f"{old!r} found in {len(hits)} cells"
    hits[0]["source"] = src(hits[0]).replace(old, new)
    return notebook


def put(folder: Path, name: str, notebook: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.ipynb").write_text(json.dumps(notebook))
    return folder / f"{name}.ipynb"


def attacks(targets: dict[str, str]) -> str:
    """A cell that tries every way around the sandbox it can, each attempt on its own."""
    return f"""
import ctypes, os, signal, time, torch
T = {targets!r}
libc = ctypes.CDLL(None, use_errno=True)
def attempt(f, *a, **k):
    try:
        f(*a, **k)
    except BaseException:
        pass
def write(p):
    with open(p, 'a') as f:
        f.write('# hacked\\n')
for p in T['write']:
    attempt(write, p)
    root = os.open('/', os.O_RDONLY)  # a directory fd, then a relative path
    attempt(os.open, p.lstrip('/'), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644, dir_fd=root)
    attempt(lambda: torch.from_file(p, shared=True, size=8, dtype=torch.uint8).fill_(35))
    attempt(os.symlink, p, '/tmp/link')
    attempt(write, '/tmp/link')
    attempt(os.unlink, '/tmp/link')
    attempt(os.link, p, '/tmp/hard')
    attempt(write, '/tmp/hard')
for rel in T['relative']:
    attempt(write, rel)
    attempt(write, '../' * 8 + rel)
# processes outside Python's audited calls: libc's system() and fork(); they try again later
attempt(libc.system, ("sh -c 'sleep 2; " + "; ".join(f"echo x >> {{p}}" for p in T['write'])
                      + " ; : {MARK}' >/dev/null 2>&1 &").encode())
pid = libc.fork()
if pid == 0:
    time.sleep(2)
    for p in T['write']:
        attempt(write, p)
    os._exit(0)
attempt(os.posix_spawn, '/bin/sleep', ['sleep', '3', '{MARK}'], {{}})
# signals to the grader and to pytest: pidfds, raw syscalls
for target in {{os.getppid(), T['pytest']}} - {{0, 1, os.getpid()}}:
    attempt(lambda: signal.pidfd_send_signal(os.pidfd_open(target), signal.SIGKILL))
    attempt(libc.syscall, 62, target, 9)
for entry in os.listdir('/proc'):
    if entry.isdigit() and int(entry) != os.getpid():
        cmd = open(f'/proc/{{entry}}/cmdline', 'rb').read() if os.path.exists(f'/proc/{{entry}}/cmdline') else b''
        if b'labkit' in cmd and b'grading.child' not in cmd:
            attempt(libc.syscall, 62, int(entry), 9)
# memory outside the limit: /dev/shm (bounded, private)
attempt(lambda: open('/dev/shm/{MARK}', 'wb').write(b'x' * 2**20))
raise RuntimeError('attacks done')  # shows in the feedback: every attempt above ran
"""


def forger(fn: str) -> str:
    """Writes results and events for `fn` as the harness would (wrong seal), then exits before grading."""
    return f"""
import json, os, torch
assert not os.path.exists('/grader/in/cases.pt')  # the hidden inputs are never a file in the sandbox
obs = [{{'obs': {{'returns (flops, bytes)': True, 'FLOPs': 2, 'bytes': 12}}}} for _ in range(4)]
torch.save({{'cases': obs}}, '/grader/out/{fn}.pt')
with open('/grader/out/events.jsonl', 'a') as f:
    for ev in ['nb_start', 'fn_start', 'fn_done', 'nb_done']:
        f.write(json.dumps({{'ev': ev, 'nb': '04_roofline', 'fn': {fn!r}, 'seal': '0' * 64}}) + '\\n')
os._exit(0)
"""


FLOOD = """
import os
fd = os.open('/grader/out/events.jsonl', os.O_WRONLY | os.O_APPEND)
line = b'{"ev": "cell_error", "nb": "04_roofline", "cell": 1, "error": "' + b'x' * 1000 + b'"}\\n'
for _ in range(30 * 1024):
    os.write(fd, line)
"""

PLANT = """
import os
class Evil:
    def __reduce__(self):
        return (os.system, ('touch /tmp/pwned',))
import torch
torch.save({'cases': [Evil()]}, '/grader/out/attainable_tflops.pt')
os.symlink('/etc/passwd', '/grader/out/matmul_flops_bytes.pt.tmp')
os.mkfifo('/grader/out/fifo.pt')
os.symlink('/grader', '/grader/out/loop')
raise RuntimeError('planted')
"""


DEEP = """
import os
for top in ('/grader/out', '/tmp', '.'):
    fd = os.open(top, os.O_RDONLY)
    for _ in range(1500):
        os.mkdir('d', dir_fd=fd)
        new = os.open('d', os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = new
    os.close(fd)
raise RuntimeError('deep chains made')
"""

TMPFILL = """
import time, torch
with open('/tmp/fill', 'wb') as f:  # tmpfs: memory that is no process's RSS
    for _ in range(650):
        f.write(b'x' * 2**20)
hold = torch.ones(650 * 2**18)  # 650 MB resident: under the limit alone, over it with /tmp
time.sleep(6)
raise RuntimeError('not stopped')
"""

INODES = """
import os, time
os.mkdir('/tmp/many')
for i in range(120_000):
    os.close(os.open(f'/tmp/many/{i}', os.O_CREAT | os.O_WRONLY))
time.sleep(3)
raise RuntimeError('not stopped')
"""

PRINTER = """
import sys, time
line = 'y' * 2**20
for _ in range(70):
    sys.stdout.write(line)
sys.stdout.flush()
time.sleep(3)
raise RuntimeError('not stopped')
"""


def tree_hash(*roots: Path, skip: tuple[Path, ...] = ()) -> dict[str, str]:
    """Path -> hash of every file, link and FIFO under `roots` (links and FIFOs by their kind and target); a
    root may be a file; folder chains of any depth are walked without recursion."""
    out = {}
    for root in roots:
        walk = [(str(root.parent), [], [root.name])] if not root.is_dir() else safeio.walk(root, 10**4, 10**7)
        for dirpath, dirs, files in walk:
            dirs[:] = [d for d in dirs if d not in (".git", "__pycache__", ".ipynb_checkpoints")]
            for name in files:
                p = Path(dirpath) / name
                if any(p == s or s in p.parents for s in skip):
                    continue
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode):
                    out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
                else:
                    out[str(p)] = f"{safeio.kind(st.st_mode)} {os.readlink(p) if stat.S_ISLNK(st.st_mode) else ''}"
    return out


def stray_processes() -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if MARK.encode() in cmd and entry.isdigit() and int(entry) != os.getpid():
            found.append(cmd.replace(b"\0", b" ").decode(errors="replace"))
    return found


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, request):
    base = tmp_path_factory.mktemp("hostile")
    subs, out = base / "submissions", base / "grades"
    subs.mkdir()
    out.mkdir()
    (out / "grades-2025-autumn.csv").write_text("student,total\nalice,14\n")  # an earlier term's grades
    (base / "outside.txt").write_text("nobody may change this\n")
    precious = base / "precious"
    precious.mkdir()
    (precious / "keep.md").write_text("a folder the grader must not write into or delete\n")
    (out / "feedback").symlink_to(precious)  # the feedback folder swapped for a link
    os.mkfifo(out / ".grades.csv.tmp")  # a FIFO and a link where temporary files used to go
    (out / ".feedback.tmp").symlink_to(base / "outside.txt")

    honest = put(subs / "honest", "04_roofline", nb("04_roofline"))
    put(subs / "honest", "05_triton_row_sum", nb("05_triton_row_sum"))
    put(subs / "honest", "03_timing", nb("03_timing"))

    def stub() -> dict:
        return nb("04_roofline", EXERCISES)

    targets = {
        "write": [str(honest), str(ROOT / "labkit" / "grading" / "judge.py"), str(ROOT / "labkit" / "evil.py"),
                  str(SOLUTIONS / "graded" / "04_roofline.py"), str(SOLUTIONS / "graded" / "00_planted.py"),
                  str(SOLUTIONS / "04_roofline.ipynb"), str(out / "grades-2025-autumn.csv"), str(out / "grades.csv"),
                  str(base / "outside.txt")],
        "relative": ["submissions/honest/04_roofline.ipynb", "grades/grades.csv", "grades/grades-2025-autumn.csv",
                     "solutions/graded/04_roofline.py", "labkit/grading/judge.py"],
        "pytest": os.getpid(),
    }
    put(subs / "attacker", "04_roofline", with_cell(stub(), attacks(targets)))
    put(subs / "forger", "04_roofline", with_cell(stub(), forger("matmul_flops_bytes")))
    put(subs / "flooder", "04_roofline", with_cell(stub(), FLOOD))
    put(subs / "planter", "04_roofline", with_cell(stub(), PLANT))
    # links and FIFOs among the submissions
    (subs / "linker").mkdir()
    (subs / "linker" / "04_roofline.ipynb").symlink_to(SOLUTIONS / "04_roofline.ipynb")
    (subs / "graded_link.ipynb").symlink_to(SOLUTIONS / "04_roofline.ipynb")
    os.mkfifo(subs / "fifo.ipynb")
    (subs / "fifo_in_folder").mkdir()
    os.mkfifo(subs / "fifo_in_folder" / "04_roofline.ipynb")
    # names that sanitise alike: each its own row
    put(subs / "col lide", "04_roofline", nb("04_roofline"))
    put(subs / "col_lide", "04_roofline", stub())
    # a re-downloaded stub beside the real work: the edited one is graded
    put(subs / "redownload", "04_roofline", nb("04_roofline"))
    put(subs / "redownload", "04_roofline (1)", stub())
    # a constant for the timing exercise; a Triton stub defined but never launched
    put(subs / "constant", "03_timing", edit(nb("03_timing"), "return float(statistics.median(times))", "return 3.5"))
    put(subs / "unlaunched", "05_triton_row_sum", edit(
        nb("05_triton_row_sum"), "row_sum_kernel[(rows,)](x, out, cols, x.stride(0), x.stride(1), BLOCK=block)",
        "out.copy_(x.float().sum(1))"))
    # what the parent must not trust (issue 40); the heaviest named to be graded last, not beside the honest student
    put(subs / "deep", "04_roofline", with_cell(stub(), DEEP))
    put(subs / "z_tmpfill", "04_roofline", with_cell(stub(), TMPFILL))
    put(subs / "z_inodes", "04_roofline", with_cell(stub(), INODES))
    put(subs / "z_printer", "04_roofline", with_cell(stub(), PRINTER))
    put(subs / "=HYPERLINK(1)", "04_roofline", stub())
    put(subs / ("x" * 255), "04_roofline", nb("04_roofline"))
    put(subs / ".hidden", "04_roofline", nb("04_roofline"))
    put(subs / "deepfolder", "04_roofline", nb("04_roofline"))
    request.addfinalizer(lambda: safeio.rmtree(subs / "deepfolder"))  # pytest's own cleanup recurses
    fd = os.open(subs / "deepfolder", os.O_RDONLY)
    for _ in range(1500):
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
    big = nb("04_roofline")
    next(c for c in big["cells"] if c["cell_type"] == "code")["outputs"] = [
        {"output_type": "stream", "name": "stdout", "text": "y" * (50 * 2**20)}]
    put(subs / "big_output", "04_roofline", big)
    put(subs / "twoedits", "04_roofline", with_cell(stub(), "x = 1  # started, then gave up"))  # the exact name
    put(subs / "twoedits", "04_roofline (1)", nb("04_roofline"))  # the finished one

    watched = (ROOT / "labkit", ROOT / "solutions", ROOT / "exercises", ROOT / "tests", subs, out, precious)
    before = tree_hash(*watched, base / "outside.txt", skip=(out / "feedback",))
    shm_before = set(os.listdir("/dev/shm"))

    env = child_env(ROOT)
    env["TMPDIR"] = str(base / "gradertmp")  # where the grader makes its work folders
    (base / "gradertmp").mkdir()
    cmd = [sys.executable, "-m", "labkit.cli", "grade", "submissions", "--out", "grades", "--workers", "2",
           "--share-cores", "--timeout", "40", "--exercise-timeout", "15", "--memory-mb", "1500", "--device", "cpu",
           "--only", "03_timing", "04_roofline", "05_triton_row_sum"]
    t0 = time.monotonic()
    run = subprocess.run(cmd, cwd=base, env=env, capture_output=True, text=True, timeout=600)  # relative paths
    seconds = time.monotonic() - t0
    strays = stray_processes()
    time.sleep(2.5)  # anything that did escape has had time to write
    after = tree_hash(*watched, base / "outside.txt", skip=(out / "grades.csv", out / "feedback"))
    assert run.returncode == 0, run.stdout + run.stderr
    with open(out / "grades.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    feedback = {p.stem: p.read_text() for p in (out / "feedback").glob("*.md")}
    return {"rows": rows, "feedback": feedback, "stdout": run.stdout, "before": before, "after": after,
            "strays": strays, "shm": set(os.listdir("/dev/shm")) - shm_before, "seconds": seconds, "base": base}


def test_the_batch_completes_and_every_submission_has_its_own_row(hostile):
    rows = hostile["rows"]
    assert {"honest", "attacker", "forger", "flooder", "planter", "linker", "graded_link", "fifo", "fifo_in_folder",
            "redownload", "constant", "unlaunched"} <= set(rows), sorted(rows)
    lide = [r for r in rows.values() if r["submission"] in ("col lide", "col_lide")]
    assert len(lide) == 2 and len({r["student"] for r in lide}) == 2  # never merged
    assert {r["submission"]: r["total"] for r in lide} == {"col lide": "2", "col_lide": "0"}
    print(f"hostile batch: {len(rows)} submissions in {hostile['seconds']:.0f} s")


def test_what_a_submission_makes_does_not_sink_the_batch_or_an_honest_student(hostile):
    rows, fb = hostile["rows"], hostile["feedback"]
    for name in ("deep", "z_tmpfill", "z_inodes", "z_printer", "HYPERLINK_1"):
        assert rows[name]["total"] == "0", (name, rows[name], fb.get(name))
    assert "deep chains made" in fb["deep"], fb["deep"]
    assert "ran out of memory" in fb["z_tmpfill"] and "/tmp" in fb["z_tmpfill"], fb["z_tmpfill"]
    assert "more than 100000 files in /tmp" in fb["z_inodes"], fb["z_inodes"]
    assert "printed more than 64 MB" in fb["z_printer"], fb["z_printer"]
    long_row = next(r for r in rows.values() if r["submission"] == "x" * 255)
    hidden = next(r for r in rows.values() if r["submission"] == ".hidden")
    for r in (long_row, hidden, rows["deepfolder"], rows["big_output"], rows["twoedits"]):
        assert r["total"] == "2" and r["matmul_flops_bytes"] == r["attainable_tflops"] == "1", (r, fb.get(r["student"]))
    assert "255 characters long" in long_row["notes"] and "starts with '.'" in hidden["notes"]
    assert "levels deep" in rows["deepfolder"]["notes"]
    assert "outputs (50 MB) were dropped" in fb["big_output"]
    assert "graded 04_roofline (1).ipynb" in rows["twoedits"]["notes"] and "not graded: 04_roofline.ipynb" in rows[
        "twoedits"]["notes"]
    assert rows["HYPERLINK_1"]["submission"] == "'=HYPERLINK(1)"  # a spreadsheet shows it, does not run it
    with open(hostile["base"] / "grades" / "grades.csv", newline="") as f:
        assert not [c for row in csv.reader(f) for c in row if c.startswith(("=", "+", "-", "@"))]
    assert not list((hostile["base"] / "gradertmp").iterdir())  # the work folders, deep chains and all, removed


def test_no_file_outside_the_graders_output_changed(hostile):
    before, after = hostile["before"], hostile["after"]
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    assert not changed, sorted(changed)
    assert not Path("/tmp/pwned").exists()
    assert not hostile["strays"], hostile["strays"]  # nothing a student started outlived its sandbox
    assert not hostile["shm"], hostile["shm"]  # /dev/shm is private to the sandbox
    feedback = hostile["base"] / "grades" / "feedback"
    assert feedback.is_dir() and not feedback.is_symlink() and (feedback / "honest.md").is_file()


def test_no_hostile_submission_gains_a_point(hostile):
    rows = hostile["rows"]
    for name in ("attacker", "forger", "flooder", "planter", "linker", "graded_link", "fifo", "fifo_in_folder"):
        assert rows[name]["total"] == "0", (name, rows[name], hostile["feedback"].get(name))
    assert rows["honest"]["total"] == rows["honest"]["out_of"] == "5", hostile["feedback"]["honest"]
    fb = hostile["feedback"]
    assert "raised RuntimeError: attacks done" in fb["attacker"], fb["attacker"]
    assert "raised RuntimeError: planted" in fb["planter"], fb["planter"]
    assert "not the ones the grader wrote" in fb["forger"] or "ended early" in fb["forger"], fb["forger"]
    assert "progress log" in fb["flooder"], fb["flooder"]
    assert "symbolic link" in rows["linker"]["notes"] and "symbolic link" in rows["graded_link"]["notes"]
    assert "FIFO" in rows["fifo"]["notes"] and "FIFO" in rows["fifo_in_folder"]["notes"]


def test_a_constant_timing_and_an_unlaunched_triton_kernel_score_zero(hostile):
    rows, fb = hostile["rows"], hostile["feedback"]
    assert rows["constant"]["median_ms"] == "0", fb["constant"]
    assert rows["unlaunched"]["row_sum"] == "0", fb["unlaunched"]
    assert "a Triton kernel of the notebook read x" in fb["unlaunched"]


def test_the_edited_notebook_is_graded_over_a_redownloaded_stub(hostile):
    r = hostile["rows"]["redownload"]
    assert r["matmul_flops_bytes"] == r["attainable_tflops"] == "1", r
    assert "2 notebooks for 04_roofline" in r["notes"] and "unedited" in r["notes"]


def test_reports_replace_links_and_fifos_without_following_them(tmp_path):
    out, victim = tmp_path / "out", tmp_path / "victim.ipynb"
    out.mkdir()
    victim.write_text("a classmate's notebook")
    (out / "grades.csv").symlink_to(victim)
    (out / "feedback").symlink_to(tmp_path)
    os.mkfifo(out / "fifo")
    from labkit.grading.report import publish

    publish(out, {"grades.csv": "student,total\n", "feedback/a.md": "# a\n"})
    assert victim.read_text() == "a classmate's notebook"
    assert not (out / "grades.csv").is_symlink() and (out / "grades.csv").read_text() == "student,total\n"
    assert (out / "feedback").is_dir() and not (out / "feedback").is_symlink()
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".md"] == []
    assert not [p for p in out.iterdir() if p.name.startswith(".labkit")]


def test_the_event_reader_is_bounded(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"ev": "a"}\n' + b"y" * 100_000 + b"\n" + b'{"ev": "b"}\n' * 10)
    r = safeio.EventReader(path, cap=1 << 20, max_line=4096)
    assert [e["ev"] for e in r.drain()] == ["a"] + ["b"] * 10
    with open(path, "ab") as f:
        f.write(b'{"ev": "c"}\n' * 200_000)
    r.drain()
    assert r.flooded and r.read_so_far <= (1 << 20) + (1 << 18)
    r.close()


def test_submissions_are_found_without_following_links(tmp_path):
    (tmp_path / "a b").mkdir()
    (tmp_path / "a_b").mkdir()
    (tmp_path / "A_B.ipynb").write_text("{}")
    (tmp_path / "link").symlink_to(SOLUTIONS)
    (tmp_path / "a b" / "nb.ipynb").symlink_to(SOLUTIONS / "04_roofline.ipynb")
    found = {s.original: s for s in submissions.find_submissions(tmp_path)}
    assert set(found) == {"a b", "a_b", "A_B.ipynb", "link"}
    ids = [s.student for s in found.values()]
    assert len(set(i.casefold() for i in ids)) == 4  # a_b, a b and A_B all differ
    assert found["a b"].notebooks == [] and "symbolic link" in found["a b"].notes[0]
    assert found["link"].notebooks == [] and "symbolic link" in found["link"].notes[0]


def test_shards_cover_everyone_once_and_merge_refuses_gaps_and_overlaps(tmp_path):
    def shard(k: int, n: int, students: list[str]) -> Path:
        d = tmp_path / f"s{k}of{n}-{'-'.join(students)}"
        d.mkdir()
        (d / "feedback").mkdir()
        rows = "".join(f"{s},{s},1,1,1,\n" for s in students)
        (d / "grades.csv").write_text("student,submission,f,total,out_of,notes\n" + rows)
        for s in students:
            (d / "feedback" / f"{s}.md").write_text(f"# {s}\n")
        (d / "shard.json").write_text(json.dumps({"shard": k, "of": n, "roster": "r", "roster_size": 3,
                                                  "students": students, "seed": 1, "columns": ["f"]}))
        return d

    a, b = shard(1, 2, ["ann", "cid"]), shard(2, 2, ["bo"])
    assert merge.merge([a, b], tmp_path / "all") == 3
    assert (tmp_path / "all" / "grades.csv").read_text().splitlines()[1:] == ["ann,ann,1,1,1,", "bo,bo,1,1,1,",
                                                                           "cid,cid,1,1,1,"]
    with pytest.raises(ValueError, match="missing"):
        merge.merge([a], tmp_path / "m1")
    with pytest.raises(ValueError, match="twice"):
        merge.merge([a, a, b], tmp_path / "m2")
    with pytest.raises(ValueError, match="overlap"):
        merge.merge([a, shard(2, 2, ["ann"])], tmp_path / "m3")


def test_without_bwrap_the_grader_refuses_and_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxError, match="apt-get install bubblewrap"):
        sandbox.make([tmp_path], False, 1024, unsafe=False)
    assert isinstance(sandbox.make([tmp_path], False, 1024, unsafe=True), sandbox.NoSandbox)


def test_two_shards_merge_into_the_grades_of_one_run(tmp_path):
    subs = tmp_path / "subs"
    put(subs / "ann", "04_roofline", nb("04_roofline"))
    put(subs / "bo", "04_roofline", nb("04_roofline", EXERCISES))
    put(subs / "cid", "04_roofline", edit(nb("04_roofline"), "return min(peak_tflops,", "return max(peak_tflops,"))
    env = child_env(ROOT)
    base = [sys.executable, "-m", "labkit.cli", "grade", str(subs), "--device", "cpu", "--only", "04_roofline",
            "--timeout", "60"]
    for k in (1, 2):
        done = subprocess.run(base + ["--out", str(tmp_path / f"shard{k}"), "--shard", f"{k}/2"], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "shard1" / "shard.json").read_text())["students"] == ["ann", "cid"]
    merged = subprocess.run([sys.executable, "-m", "labkit.cli", "grade", "merge", str(tmp_path / "shard1"),
                             str(tmp_path / "shard2"), "--out", str(tmp_path / "all")], env=env,
                            capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    with open(tmp_path / "all" / "grades.csv", newline="") as f:
        totals = {r["student"]: r["total"] for r in csv.DictReader(f)}
    assert totals == {"ann": "2", "bo": "0", "cid": "1"}
    assert sorted(p.name for p in (tmp_path / "all" / "feedback").iterdir()) == ["ann.md", "bo.md", "cid.md"]
    alone = subprocess.run([sys.executable, "-m", "labkit.cli", "grade", "merge", str(tmp_path / "shard1"),
                            "--out", str(tmp_path / "half")], env=env, capture_output=True, text=True, timeout=120)
    assert alone.returncode == 2 and "shard(s) 2/2 missing" in alone.stderr
    grades = tmp_path / "shard1" / "grades.csv"
    with open(grades, newline="") as f:
        table = list(csv.reader(f))
    cid = next(r for r in table if r[0] == "cid")
    cid[2:6] = ["1", "1", "2", "2"]  # cid's points, edited to full marks
    with open(grades, "w", newline="") as f:
        csv.writer(f).writerows(table)
    edited = subprocess.run([sys.executable, "-m", "labkit.cli", "grade", "merge", str(tmp_path / "shard1"),
                             str(tmp_path / "shard2"), "--out", str(tmp_path / "edited")], env=env,
                            capture_output=True, text=True, timeout=120)
    assert edited.returncode == 2 and "differ from what the grader wrote" in edited.stderr, edited.stderr
    assert not (tmp_path / "edited" / "grades.csv").exists()


def test_a_compiler_outside_the_system_folders_runs_inside(tmp_path, monkeypatch):
    """Triton's launcher stub and the CUDA exercise build with the host's compiler, e.g. CC=/opt/gcc/bin/gcc."""
    prefix = tmp_path / "opt-gcc"
    (prefix / "bin").mkdir(parents=True)
    gcc = prefix / "bin" / "gcc"
    gcc.write_text("#!/bin/sh\necho fake-gcc\n")
    gcc.chmod(0o755)
    monkeypatch.setenv("CC", str(gcc))
    assert str(prefix) in sandbox.toolchain_paths()
    box = sandbox.make([], False, 512, unsafe=False, imports=False)
    run = subprocess.run(box.base() + ["--", str(gcc)], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "fake-gcc", run.stderr
