"""Exercise 12 (the batching policy): the check and `labkit grade` pass the rules and fail degenerate policies."""
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import check
from labkit.serving.batcher import launch_delay
from labkit.exercises import ex12_serving
from labkit.grading import specs
from labkit.paths import child_env

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"
NB = "12_serving"

WRONG = {  # policies a student might write, each breaking a rule somewhere
    "always_now": "return 0.0",
    "always_max_delay": "return max_delay_s",
    "ignores_full": "return max(0.0, max_delay_s - oldest_wait_s)",
    "half_delay": "return 0.0 if n_waiting >= max_batch else max(0.0, max_delay_s / 2 - oldest_wait_s)",
    "never": "return float('inf')",
}
IMPORTED = ("    from labkit.serving.batcher import launch_delay as answer\n"
            "    return answer(n_waiting, oldest_wait_s, max_batch, max_delay_s)\n")
SOLUTION_BODY = ("    if n_waiting >= max_batch:\n        return 0.0\n"
                 "    return max(0.0, max_delay_s - oldest_wait_s)\n")


def policy(body: str):
    ns: dict = {}
    exec(f"def launch_delay(n_waiting, oldest_wait_s, max_batch, max_delay_s):\n    {body}\n", ns)
    return ns["launch_delay"]


def hidden_cases() -> tuple[specs.FnSpec, list[dict]]:
    spec = specs.load_specs(SOLUTIONS / "graded")[NB][0]
    return spec, specs.make_cases(spec, specs.default_seed(SOLUTIONS / "graded"), False)


def passed(spec, fn, cases) -> int:
    n = 0
    for c in cases:
        try:
            n += not spec.fn.compare(c["expected"], spec.fn.call(fn, c["args"]), 0.0, c["atol"])
        except Exception:
            pass
    return n


def test_the_rules_pass_and_wrong_policies_fail_the_visible_check(capsys):
    assert check.launch_delay(launch_delay) is True
    for name, body in WRONG.items():
        assert check.launch_delay(policy(body)) is False, name
    out = capsys.readouterr().out
    assert "launched too early" in out and "launched too late" in out and "keeps answering 'wait'" in out
    assert check.launch_delay(policy("return None")) is False
    assert "return seconds to wait" in capsys.readouterr().out


@pytest.mark.parametrize("const", [0.0, -1.0, 1e-6, 1e-3, 2e-3, 1.0, math.inf])
def test_no_constant_policy_passes_the_hidden_cases(const):
    spec, cases = hidden_cases()
    assert passed(spec, lambda *a: const, cases) <= len(cases) // 2


def test_timeline_judge_counts_answers_and_batch_sizes():
    case = ex12_serving.trace_case("three requests", [0.0, 1e-4, 2e-4], 2, 1e-3)
    judge = ex12_serving.judge_timeline
    assert judge(case["expected"], {"batch_sizes": [2, 1], "launches_s": case["expected"]["launches_s"]}) == []
    assert "answered exactly once" in judge(case["expected"], {"batch_sizes": [2, 2], "launches_s": [1e-4, 2e-3]})[0]
    assert "more than max_batch=2" in judge(case["expected"], {"batch_sizes": [3], "launches_s": [2e-4]})[0]


def test_grader_gives_the_solution_full_marks_and_wrong_policies_less(tmp_path, grader_sandbox_flags):
    subs, out = tmp_path / "subs", tmp_path / "out"
    sol = json.loads((SOLUTIONS / f"{NB}.ipynb").read_text())
    notebooks = {"solution": sol, "exercise": json.loads((EXERCISES / f"{NB}.ipynb").read_text())}
    for name in ("always_now", "always_max_delay"):
        wrong = json.loads(json.dumps(sol))
        cell = next(c for c in wrong["cells"] if SOLUTION_BODY in "".join(c["source"]))
        cell["source"] = "".join(cell["source"]).replace(SOLUTION_BODY, f"    {WRONG[name]}\n")
        notebooks[name] = wrong
    importer = json.loads(json.dumps(sol))  # labkit's own policy, imported: a stub while graded
    cell = next(c for c in importer["cells"] if SOLUTION_BODY in "".join(c["source"]))
    cell["source"] = "".join(cell["source"]).replace(SOLUTION_BODY, IMPORTED)
    # a cell that uses labkit's own policy
    use = "from labkit.serving import batcher\nassert batcher.launch_delay(8, 0.0, 8, 1e-3) == 0.0"
    importer["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "id": "use",
                              "source": use})
    notebooks["importer"] = importer
    for student, content in notebooks.items():
        (subs / student).mkdir(parents=True)
        (subs / student / f"{NB}.ipynb").write_text(json.dumps(content))
    cmd = [sys.executable, "-m", "labkit.cli", "grade", str(subs), "--out", str(out), "--only", NB, "--workers", "2",
           "--timeout", "60", "--exercise-timeout", "15", "--device", "cpu", *grader_sandbox_flags]
    run = subprocess.run(cmd, cwd=ROOT, env=child_env(ROOT), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(out / "grades.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    feedback = {p.stem: p.read_text() for p in (out / "feedback").glob("*.md")}
    assert rows["solution"]["launch_delay"] == rows["solution"]["out_of"] == "2", feedback["solution"]
    assert rows["exercise"]["launch_delay"] == "0" and "not done yet" in feedback["exercise"]
    assert float(rows["always_now"]["launch_delay"]) < 1 and "launched too early" in feedback["always_now"]
    assert (float(rows["always_max_delay"]["launch_delay"]) < 1
            and "keeps answering 'wait'" in feedback["always_max_delay"])
    # the import trick scores zero and says why
    assert rows["importer"]["launch_delay"] == "0", feedback["importer"]
    assert "is what exercise 12_serving asks you to write" in feedback["importer"], feedback["importer"]
    if grader_sandbox_flags:  # --unsafe-no-sandbox: labkit's own copy, the answer a stub only while it is graded
        assert "code cell" not in feedback["importer"], feedback["importer"]
    else:  # the sandbox's labkit has no answers at all (issue 40): a cell that calls one is told so
        assert "the grader's copy of labkit does not have it; write your own" in feedback["importer"], \
            feedback["importer"]
