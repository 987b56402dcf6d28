"""Judging in the parent: load a child's results as data only and compare them with the expected ones."""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

from labkit.grading import safeio, seal
from labkit.grading.specs import FnSpec

NEEDS_GPU = "needs GPU"
MAX_RESULT_BYTES = 256 * 2**20


@dataclass
class Outcome:
    points: float
    score: float | None = 0.0  # None: not graded here (needs a GPU)
    status: str = "not submitted"
    messages: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)  # a scored function's figures, for the leaderboard


def load_results(path: Path, key: str | None = None, mac: object = None) -> tuple[list | None, str | None]:
    """A results file ({"cases": [...]}): a regular file (no link followed), size-capped, sealed with the
    run's key when `key` is given, read with weights_only, so it can hold data and nothing that runs."""
    import torch

    try:
        payload = safeio.read_bytes(path, MAX_RESULT_BYTES)
    except FileNotFoundError:
        return None, None
    except safeio.UnsafeFile as exc:
        return None, f"its results were refused: {exc}"
    if key is not None and not seal.check(key.encode(), path.stem, payload, mac):
        return None, "its results were refused: they are not the ones the grader wrote (changed or forged)"
    try:
        data = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception as exc:
        return None, f"its results could not be read ({type(exc).__name__})"
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        return None, "its results were malformed"
    return data["cases"], None


def judge(spec: FnSpec, results: list | None, reason: str | None) -> Outcome:
    """Points for the cases whose result matches (or the fraction a scored case earned); messages saying
    what differed (the first few)."""
    out = Outcome(spec.points)
    if results is None:
        out.status, out.messages = "failed", [reason or "no result (the function was never graded)"]
        return out
    if len(results) != len(spec.cases):  # checked against the cases the parent made
        out.status = "failed"
        out.messages = [f"its results do not match the cases it was given ({len(results)} results for "
                        f"{len(spec.cases)} cases)"]
        return out
    passed, earned, failures = 0, 0.0, []
    for i, case in enumerate(spec.cases):
        r = results[i] if i < len(results) and isinstance(results[i], dict) else {"error": "no result"}
        if "obs" in r and spec.fn.score is not None:
            frac, notes, details = _scored(spec, case, r["obs"])
            earned += frac
            out.details = out.details or details
            if frac > 0:
                out.messages += [f"on {case['about']}: {n}" for n in notes]
                passed += frac >= 1
                continue
            problems = notes or ["scored zero"]
        elif "obs" in r:
            problems = spec.fn.compare(case["expected"], r["obs"], case.get("rtol", 0.0), case.get("atol", 0.0))
        elif r.get("timeout"):
            problems = ["timed out: stopped at the exercise's time limit"]
        else:
            problems = [str(r.get("error") or "no result")[:400]]
        if problems:
            failures.append((case["about"], "; ".join(problems)))
        else:
            passed += 1
            earned += 1
    if failures and passed == 0 and len({p for _, p in failures}) == 1:  # the same reason every time
        out.messages.append(f"on all {len(failures)} case(s): {failures[0][1]}")
    else:
        out.messages += [f"on {about}: {p}" for about, p in failures[:3]]
        if len(failures) > 3:
            out.messages.append(f"... and {len(failures) - 3} more case(s) failed")
    out.score = round(spec.points * earned / max(len(spec.cases), 1), 2)
    out.status = "ok" if passed == len(spec.cases) else ("partial" if earned > 0 else "failed")
    return out


def _scored(spec: FnSpec, case: dict, obs: object) -> tuple[float, list[str], dict]:
    """A scored case: (fraction of its points in [0, 1], notes, leaderboard figures); a broken scorer scores 0."""
    try:
        frac, notes, details = spec.fn.score(case["expected"], obs)
        frac = min(1.0, max(0.0, float(frac)))
    except Exception as exc:  # the observation came from the student's process: it may be anything
        return 0.0, [f"its result could not be scored ({type(exc).__name__}: {str(exc)[:200]})"], {}
    return frac, [str(n) for n in notes], dict(details) if isinstance(details, dict) else {}
