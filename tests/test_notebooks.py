"""Committed notebooks are clean, parameterised, and linked from the index in order."""
import json
import re
from pathlib import Path

import pytest
from conftest import committed_text

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
ALL = NOTEBOOKS + sorted((ROOT / "solutions").glob("*.ipynb")) + sorted((ROOT / "exercises").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no NN_*.ipynb"


@pytest.mark.parametrize("path", ALL + [ROOT / "notebooks" / "index.ipynb"], ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = json.loads(committed_text(path))  # git's copy: outputs a student's JupyterLab saved are theirs
    dirty = [i for i, c in enumerate(nb["cells"])
             if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{path.name}: cells {dirty} hold outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_has_a_parameters_cell_with_device_and_quick(path):
    nb = json.loads(path.read_text())
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
    source = "".join(tagged[0]["source"])
    assert re.search(r"^device\s*=", source, re.M) and re.search(r"^quick\s*=", source, re.M)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_records_figures_and_uses_labkit_timing(path):
    code = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    assert "labkit.record(" in code, f"{path.name} records no figure for batch runs"
    assert "time.time()" not in code, f"{path.name}: time with labkit.bench, not time.time()"
    assert not re.search(r"^\s*!", code, re.M), f"{path.name}: run shell commands with subprocess, not !"


def test_index_links_every_notebook_in_order():
    index = json.loads((ROOT / "notebooks" / "index.ipynb").read_text())
    text = "".join("".join(c["source"]) for c in index["cells"])
    links = re.findall(r"\]\(([0-9][^)]*\.ipynb)\)", text)
    assert links == [p.name for p in NOTEBOOKS]


# a number followed by a unit the course measures; a hardware constant that is not measured says where it
# comes from, visibly, on its line: "(source: ...)"
MEASURED = re.compile(r"\d[\d,.]*\s*(?:x\s*(?:faster|slower|less|more)|[GT]B/s|[GT]FLOP/s|ms\b|µs|us\b|ns\b|%)")


def _markdown(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("path", ALL + [ROOT / "notebooks" / "index.ipynb"], ids=lambda p: p.name)
def test_nothing_cites_files_students_do_not_have(path):
    text = path.read_text()
    assert "COURSE.md" not in text and "../shared" not in text, f"{path.name} cites a file outside the repository"


@pytest.mark.parametrize("path", ALL + [ROOT / "notebooks" / "index.ipynb"], ids=lambda p: p.name)
def test_prose_types_in_no_measured_figure(path):
    typed = [line.strip() for md in _markdown(path) for line in md.splitlines()
             if MEASURED.search(line) and "(source:" not in line]
    assert not typed, (f"{path.name}: prose states measured-looking figures; let a claim print them, or give a "
                       f"hardware constant its source on that line, '(source: ...)': {typed[:3]}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_checks_claims_and_starts_predictions_blank(path):
    code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    assert "labkit.claim(" in code, f"{path.name} records no claim: verdicts come from labkit.claim"
    # [ \t]* then \S: the spaces before None cannot be given back to let the None look-ahead pass
    prefilled = re.findall(r"^[ \t]*(?:my_)?guess\w*[ \t]*=[ \t]*(?!None\b)(\S.*)$", code, re.M)
    assert not prefilled, f"{path.name}: prediction cells start as None, not {prefilled[:3]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_parameter_says_its_kind_so_batch_runs_refuse_bad_values_up_front(path):
    from labkit.tools import run as runner

    unknown = [name for name, (default, kind) in runner.declared_parameter_kinds(path).items()
               if kind is None and name not in ("device", "quick")]
    assert not unknown, (f"{path.name}: annotate these parameters (e.g. `max_bytes: int = None`), so "
                         f"`labkit run -p NAME VALUE` can refuse a value of the wrong kind: {unknown}")
