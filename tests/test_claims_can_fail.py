"""Every claim in the course can fail: read statically from the notebooks, and with every claim's test inverted,
where each must then fail unless a diagnosis that holds here explains it. The inverted verdicts come from the notebook
tests' own run of this session (labkit.claim logs them: LABKIT_CLAIMS_LOG, see tests/conftest.py), or, where this
session ran no notebooks, from running every notebook with LABKIT_CLAIMS_INVERT=1."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import claimnames, claims, reference
from labkit.paths import course_notebooks
from labkit.tools import nbio

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = course_notebooks()


def _calls(path: Path, names: tuple[str, ...]) -> list[ast.Call]:
    """Calls of labkit.<name>(...) (or <name>(...)) in a notebook's code cells."""
    found = []
    for i, cell in enumerate(nbio.read(path)["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        src = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())
        try:
            tree = ast.parse(src)
        except SyntaxError as exc:  # a notebook whose code does not parse fails its own tests
            pytest.fail(f"{path.name} cell {i}: {exc}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name in names:
                    found.append(node)
    return found


def _arg(call: ast.Call, position: int, keyword: str) -> ast.AST | None:
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_claim_is_decided_by_a_constant_or_excused_in_words(path):
    problems = []
    for call in _calls(path, ("claim",)):
        where = f"{path.name} line {call.lineno}"
        if any(k.arg == "otherwise" for k in call.keywords):
            problems.append(f"{where}: otherwise= (an excuse in words; a miss needs a measured diagnosis)")
        holds = _arg(call, 2, "holds")
        if isinstance(holds, ast.Constant) and holds.value is not None:
            problems.append(f"{where}: holds={holds.value!r} is a constant, so the claim cannot fail")
    for call in _calls(path, ("diagnosis",)):
        holds = _arg(call, 2, "holds")
        if isinstance(holds, ast.Constant):
            problems.append(f"{path.name} line {call.lineno}: a diagnosis whose check is the constant "
                            f"{holds.value!r} explains nothing")
    assert not problems, "\n".join(problems)


def _inverted_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("inverted")
    env = {k: v for k, v in os.environ.items() if k != "LABKIT_CLAIMS_STRICT"}
    env.update(LABKIT_CLAIMS_INVERT="1", LABKIT_QUICK="1", MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "-m", "labkit.cli", "run", "-o", str(out), "--allow-failed-claims",
                           "--timeout", "600",  # per cell, as nbval's quick runs: a hung cell fails, named
                           *map(str, NOTEBOOKS)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert (out / "summary.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_cell_branches_on_a_verdict(path):
    """The inverted verdicts are judged on the notebook tests' own figures (LABKIT_CLAIMS_LOG), which is sound only
    while no cell reads a verdict back: a notebook that did would run differently with its claims inverted."""
    read = []
    for i, cell in enumerate(nbio.read(path)["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in "".join(cell["source"]).splitlines())
        for node in ast.walk(ast.parse(src)):
            key = (node.slice if isinstance(node, ast.Subscript) else
                   node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and node.func.attr == "get" and node.args else None)
            if isinstance(key, ast.Constant) and key.value in ("status", "note", "uninverted"):
                read.append(f"{path.name} cell {i} line {node.lineno}: reads a claim's {key.value!r}")
            if isinstance(node, ast.Attribute) and node.attr in ("HELD", "FAILED", "DIFFERS", "INCONCLUSIVE"):
                read.append(f"{path.name} cell {i} line {node.lineno}: compares with claims.{node.attr}")
    assert not read, "\n".join(read)


def _logged_run() -> dict | None:
    """The inverted verdicts the notebook tests of this session logged, as `labkit run` summarises a run; None where
    this session did not run every course notebook."""
    from conftest import CLAIMS_LOG, NOTEBOOK_RUNS

    paths = [str(p.resolve()) for p in NOTEBOOKS]
    if not all(NOTEBOOK_RUNS.get(p, "not run") != "not run" for p in paths):
        return None
    found: dict[str, dict] = {p: {} for p in paths}
    for log in Path(CLAIMS_LOG).glob("claims-*.jsonl"):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record["notebook"] in found:
                found[record["notebook"]][record["claim"]["name"]] = record["claim"]
    return {"notebooks": [{"notebook": p, "status": "ok" if NOTEBOOK_RUNS[p] == "ok" else "error",
                           "error": NOTEBOOK_RUNS[p], "claims": found[p]} for p in paths]}


@pytest.fixture(scope="module")
def inverted(tmp_path_factory) -> dict:
    logged = _logged_run()
    return logged if logged is not None else _inverted_run(tmp_path_factory)


def test_every_claim_fails_when_its_test_is_inverted(inverted):
    """A claim whose test held here must, inverted, end FAILED, or DIFFERS where a diagnosis measured here holds
    (listed for review), or INCONCLUSIVE where the spread or a busy host cannot decide; never HOLDS. A claim whose
    test missed here holds inverted: its normal verdict (the notebook tests) is the miss's."""
    broken = [f"{Path(e['notebook']).name}: {e['error']}" for e in inverted["notebooks"] if e["status"] != "ok"]
    assert not broken, "notebooks that broke with inverted claims:\n" + "\n".join(broken)
    entries = [(Path(e["notebook"]).stem, c) for e in inverted["notebooks"] for c in e["claims"].values()]
    decided = [(nb, c) for nb, c in entries if c["status"] != "skipped"]
    assert decided and all(c.get("inverted") and "uninverted" in c for _, c in decided), "a claim bypassed inversion"
    counts = claims.tally({f"{nb}:{c['name']}": c for nb, c in entries})
    rescued = [f"  {nb}: {c['name']} <- {c['note']}" for nb, c in decided if c["status"] == claims.DIFFERS]
    undecided = [f"  {nb}: {c['name']} ({c['note']})" for nb, c in decided if c["status"] == claims.INCONCLUSIVE]
    missed = [f"  {nb}: {c['name']}" for nb, c in decided if not c["uninverted"]]
    print(f"\ninverted claims (quick mode, this machine): {counts}")
    print("rescued by a diagnosis that holds here (review them):\n" + "\n".join(rescued or ["  none"]))
    print("inconclusive (noise here):\n" + "\n".join(undecided or ["  none"]))
    print("missed in this run (their normal verdict is the miss's):\n" + "\n".join(missed or ["  none"]))
    cannot_fail = [f"{nb}: {c['name']}" for nb, c in decided if c["uninverted"] and c["status"] == claims.HELD]
    print(f"claims that cannot fail: {len(cannot_fail)}")
    assert not cannot_fail, f"{len(cannot_fail)} claim(s) held with their test inverted:\n" + "\n".join(cannot_fail)


def _diagnoses_offered(stem: str) -> list[claimnames.ClaimName] | None:
    """The diagnosis names a notebook's source offers (read as claim names are); None where one cannot be read
    statically, so that every recorded name counts."""
    path = next((p for p in NOTEBOOKS if p.stem == stem), None)
    try:
        return None if path is None else claimnames.in_notebook(path, calls=("diagnosis",))
    except claimnames.UnreadableClaimName:
        return None


def test_no_diagnosis_holds_on_every_machine(inverted):
    """A diagnosis true on the CPU run here and on every committed GPU reference is a constant, not a cause. A
    reference run's record of a diagnosis its notebook no longer offers explains nothing now, and is not counted."""
    seen: dict[tuple[str, str, str], list[bool]] = {}
    offered = {}

    def add(summary: dict) -> None:
        for e in summary.get("notebooks", []):
            stem = Path(e["notebook"]).stem
            if stem not in offered:
                offered[stem] = _diagnoses_offered(stem)
            for c in (e.get("claims") or {}).values():
                for d in c.get("diagnoses") or []:
                    if offered[stem] is not None and not any(n.matches(d["name"]) for n in offered[stem]):
                        continue
                    seen.setdefault((stem, c["name"], d["name"]), []).append(bool(d["holds"]))

    add(inverted)
    machines = 1
    for folder in reference.runs():
        summary = json.loads((folder / "summary.json").read_text())
        if any(c.get("diagnoses") for e in summary.get("notebooks", []) for c in (e.get("claims") or {}).values()):
            add(summary)
            machines += 1
    constant = [f"{nb}: {claim} / {d} (held on all {len(v)} machines)" for (nb, claim, d), v in seen.items()
                if len(v) >= 2 and all(v)]
    print(f"\ndiagnoses seen on {machines} machine(s): {len(seen)}")
    assert not constant, "diagnoses that hold everywhere explain nothing:\n" + "\n".join(constant)
