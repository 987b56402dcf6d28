"""Judging in the parent: load a child's results as data only and compare them with the expected ones."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading.specs import FnSpec

NEEDS_GPU = "needs GPU"
MAX_RESULT_BYTES = 256 * 2**20


@dataclass
class Outcome:
    points: float
    score: float | None = 0.0  # None: not graded here (needs a GPU)
    status: str = "not submitted"
    messages: list[str] = field(default_factory=list)


def load_results(path: Path) -> tuple[list | None, str | None]:
    """A results file ({"cases": [...]}) read with weights_only, so it can hold data and nothing that runs."""
    import torch

    if not path.exists():
        return None, None
    if path.stat().st_size > MAX_RESULT_BYTES:
        return None, "its results were too large to read"
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:
        return None, f"its results could not be read ({type(exc).__name__})"
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        return None, "its results were malformed"
    return data["cases"], None


def judge(spec: FnSpec, results: list | None, reason: str | None) -> Outcome:
    """Points for the cases whose result matches; messages saying what differed (the first few)."""
    out = Outcome(spec.points)
    if results is None:
        out.status, out.messages = "failed", [reason or "no result (the function was never graded)"]
        return out
    passed, failures = 0, []
    for i, case in enumerate(spec.cases):
        r = results[i] if i < len(results) and isinstance(results[i], dict) else {"error": "no result"}
        if "obs" in r:
            problems = spec.fn.compare(case["expected"], r["obs"], case.get("rtol", 0.0), case.get("atol", 0.0))
        elif r.get("timeout"):
            problems = ["timed out: stopped at the exercise's time limit"]
        else:
            problems = [str(r.get("error") or "no result")[:400]]
        if problems:
            failures.append((case["about"], "; ".join(problems)))
        else:
            passed += 1
    if failures and passed == 0 and len({p for _, p in failures}) == 1:  # the same reason every time
        out.messages.append(f"on all {len(failures)} case(s): {failures[0][1]}")
    else:
        out.messages += [f"on {about}: {p}" for about, p in failures[:3]]
        if len(failures) > 3:
            out.messages.append(f"... and {len(failures) - 3} more case(s) failed")
    out.score = round(spec.points * passed / max(len(spec.cases), 1), 2)
    out.status = "ok" if not failures else ("partial" if passed else "failed")
    return out
