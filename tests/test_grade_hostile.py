"""The grader's parent against what a submission or its process can make (issue 40), without running a child:
folder chains deeper than Python's recursion limit, 255-character names, 50 MB cell outputs, spreadsheet
formulas as names, hidden folders, several edited notebooks, forged and edited shard folders.
The same classes, graded for real in the sandbox, are in test_grade_sandbox.py's hostile batch."""
import csv
import io
import json
import os
from pathlib import Path

import pytest

from labkit.grading import merge, report, safeio, seal, submissions
from labkit.grading.judge import Outcome

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"
NB = "04_roofline"


def chain(top: Path, depth: int, name: str = "d") -> Path:
    """A folder chain `depth` levels deep below top, made fd-relative (its path may pass PATH_MAX); its bottom."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        new = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = new
    os.close(fd)
    return top


def test_a_folder_chain_deeper_than_the_recursion_limit_is_walked_and_removed(tmp_path):
    top = chain(tmp_path / "out", 1500)
    chain(tmp_path / "out", 1200, "a-much-longer-folder-name")  # its paths pass PATH_MAX (4096)
    (tmp_path / "out" / "d" / "x.pt").write_bytes(b"x" * 5000)
    os.chmod(top / "d" / "d", 0)  # an unreadable folder on the way
    (top / "link").symlink_to(ROOT)  # never followed
    assert 4096 <= safeio.tree_bytes(top) < 2**62
    assert safeio.tree_bytes(top, limit=1000) == 2**62  # more levels than the limit: over any cap
    gen = safeio.walk(top)
    seen = []
    with pytest.raises(StopIteration) as stop:
        while True:
            seen.append(next(gen)[0])
    assert "32 levels deep" in stop.value.value and len(seen) <= 2 * safeio.MAX_DEPTH + 1
    safeio.rmtree(top)
    assert not top.exists() and (ROOT / "labkit").is_dir()


def test_a_deep_submission_folder_and_a_255_character_name_get_their_rows(tmp_path):
    long_name = "x" * 255
    for name in ("deep", long_name, ".hidden", "=HYPERLINK(1)", ".ipynb_checkpoints"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{NB}.ipynb").write_bytes((SOLUTIONS / f"{NB}.ipynb").read_bytes())
    chain(tmp_path / "deep", 1500)
    try:
        found = {s.original: s for s in submissions.find_submissions(tmp_path)}
    finally:
        safeio.rmtree(tmp_path / "deep" / "d")  # pytest's own cleanup of old temporary folders recurses
    assert set(found) == {"deep", long_name, ".hidden", "=HYPERLINK(1)"}  # Jupyter's checkpoints: no student
    assert [p.name for p in found["deep"].notebooks] == [f"{NB}.ipynb"]
    assert any("levels deep" in n for n in found["deep"].notes)
    sid = found[long_name].student
    assert len(sid) <= submissions.MAX_ID and "255 characters" in found[long_name].notes[0]
    assert found[".hidden"].student == "hidden" and "starts with '.'" in found[".hidden"].notes[0]
    assert found["=HYPERLINK(1)"].student[0].isalnum()
    reports = [report.StudentReport(s.student, {}, original=s.original, choices=s.notes) for s in found.values()]
    out = tmp_path.parent / f"{tmp_path.name}-out"
    report.write_reports(out, reports, [], "the CPU")  # a feedback file per student: none too long a name
    assert sorted(p.stem for p in (out / "feedback").iterdir()) == sorted(s.student for s in found.values())


def test_csv_cells_that_a_spreadsheet_would_run_are_escaped():
    r = report.StudentReport("-2+3", {"f": Outcome(1, 0.0, "failed")}, original="=cmd|'/C calc'!A0",
                             incidents=["@SUM(A1)"])

    class Col:
        name, points = "f", 1.0
    rows = list(csv.reader(io.StringIO(report.grades_csv([r], [Col]))))
    assert all(not c.startswith(report.FORMULA) for row in rows for c in row), rows
    assert rows[1][1] == "'=cmd|'/C calc'!A0" and rows[1][0] == "'-2+3"
    assert submissions.safe_name("-rf =1+2") == "rf_1_2"


def test_a_50_mb_cell_output_is_dropped_not_held_against_the_student(tmp_path):
    notebook = json.loads((SOLUTIONS / f"{NB}.ipynb").read_text())
    code = next(c for c in notebook["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "y" * (50 * 2**20)}]
    path = tmp_path / f"{NB}.ipynb"
    path.write_text(json.dumps(notebook))
    assert path.stat().st_size > 50 * 2**20
    cells, notes = submissions.extract_code(path)
    reference, _ = submissions.extract_code(SOLUTIONS / f"{NB}.ipynb")
    assert cells == reference
    assert any("outputs (50 MB) were dropped" in n for n in notes), notes
    assert submissions.match_notebooks([path], [NB])[0] == {NB: path}


def test_of_two_edited_notebooks_the_one_with_the_work_is_graded_and_the_other_named(tmp_path):
    stub = json.loads((EXERCISES / f"{NB}.ipynb").read_text())
    stub["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                          "source": "x = 1  # started, then gave up", "id": "started"})
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    (tmp_path / "a" / f"{NB}.ipynb").write_text(json.dumps(stub))  # named exactly like the exercise: unfinished
    (tmp_path / "a" / f"{NB} (1).ipynb").write_bytes((SOLUTIONS / f"{NB}.ipynb").read_bytes())
    (tmp_path / "b" / f"{NB} (1).ipynb").write_bytes((SOLUTIONS / f"{NB}.ipynb").read_bytes())  # copied in the
    (tmp_path / "b" / f"{NB}.ipynb").write_text(json.dumps(stub))  # other order: the same choice
    fns = {NB: ["matmul_flops_bytes", "attainable_tflops"]}
    for folder in ("a", "b"):
        paths = sorted((tmp_path / folder).iterdir(), reverse=folder == "b")
        matched, notes = submissions.match_notebooks(paths, [NB], {NB: EXERCISES / f"{NB}.ipynb"}, fns)
        assert matched[NB].name == f"{NB} (1).ipynb", notes
        assert "2 of 2" in notes[0] and "0 of 2" in notes[0] and f"not graded: {NB}.ipynb" in notes[0], notes


def shard(d: Path, k: int, n: int, students: list[str], graded: Path | None = None) -> Path:
    """A shard's --out as the grader writes it (sealed with `graded`'s key when given)."""
    files = {f"feedback/{s}.md": f"# {s}\n" for s in students}
    files["grades.csv"] = "student,submission,f,total,out_of,notes\n" + "".join(f"{s},{s},1,1,1,\n" for s in students)
    m = {"shard": k, "of": n, "roster": "r", "roster_size": 3, "students": students, "seed": 1, "columns": ["f"]}
    if graded is not None:
        m["seal"] = seal.seal_files(seal.graded_key(graded, 1), {**files, "shard.json": json.dumps(m, sort_keys=True)})
    report.publish(d, {**files, "shard.json": json.dumps(m)})
    return d


def test_merge_refuses_edited_points_and_ids_that_leave_the_output(tmp_path):
    graded = tmp_path / "graded"
    graded.mkdir()
    (graded / "04_roofline.py").write_text("EXERCISES = {}\n")
    (graded / "SEED").write_text("1\n")
    a, b = shard(tmp_path / "a", 1, 2, ["ann", "cid"], graded), shard(tmp_path / "b", 2, 2, ["bo"], graded)
    assert merge.merge([a, b], tmp_path / "all", graded) == 3
    (a / "grades.csv").write_text((a / "grades.csv").read_text().replace("cid,cid,1,1,1", "cid,cid,1,9,1"))
    with pytest.raises(ValueError, match="differ from what the grader wrote"):
        merge.merge([a, b], tmp_path / "m1", graded)
    unsealed = shard(tmp_path / "c", 1, 2, ["ann", "cid"])  # a seal made without the hidden tests
    with pytest.raises(ValueError, match="differ from what the grader wrote"):
        merge.merge([unsealed, b], tmp_path / "m2", graded)
    before = sorted(p.name for p in tmp_path.iterdir())
    for bad in ("../escaped", "/tmp/abs", "..", "a/b", ".hidden"):
        evil = shard(tmp_path / "evil", 2, 2, ["bo"], graded)
        m = json.loads((evil / "shard.json").read_text())
        (evil / "shard.json").write_text(json.dumps(dict(m, students=[bad])))
        with pytest.raises(ValueError, match="not plain file names"):
            merge.merge([a, evil], tmp_path / "m3")
        safeio.rmtree(evil)
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not (tmp_path / "escaped.md").exists()
