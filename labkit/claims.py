"""Claims: a notebook's prediction checked against this run, with the verdict printed and recorded.

    labkit.claim("pinned_beats_pageable", "pinned host->device copies are at least 1.5x faster than pageable",
                 lambda f: f["pinned"] > 1.5 * f["pageable"],
                 figures={"pinned": (pinned.map(to_gbps), "GB/s"), "pageable": (pageable.map(to_gbps), "GB/s")},
                 because="pinned pages go straight to the copy engine; pageable ones are staged first",
                 diagnoses=[labkit.diagnosis("memcpy_keeps_up", "this host's memcpy into the staging buffer is as "
                                             "fast as the link", holds=memcpy_gbps > link_gbps,
                                             figures={"memcpy": (memcpy_gbps, "GB/s")})])

The verdict is one of:
- HOLDS: the prediction held on this run.
- DIFFERS: it did not hold, and a diagnosis measured on this machine explains why (the verdict names it with its
  figures). A diagnosis is a prediction of its own about this run, checked here; one that holds on every machine
  explains nothing.
- FAILED: it did not hold and no diagnosis holds here. `labkit run`, the notebook tests and the GPU CI fail.
- INCONCLUSIVE: the figures' spread cannot decide it, or the host was busy while a timed claim was measured
  (labkit.stats says how this is decided). The advice is to rerun on a quiet machine, never an invented cause.
- SKIPPED: this machine lacks what the claim needs (`needs=`).
Correctness claims (equal results, exact arithmetic, bytes as counted) take no diagnoses.

`holds` is True/False, or a test of the figures (`lambda f: ...`, given each figure's value, the median where
it has samples) so that figures measured with repeats (a `labkit.Timing`, `labkit.Samples`) are resampled.
LABKIT_CLAIMS_INVERT=1 inverts every claim's test (tests/test_claims_can_fail.py: each claim must then fail,
unless a diagnosis that really holds here explains it). LABKIT_CLAIMS_LOG=DIR (set by the test session) appends
each claim, with the verdict its inverted test would get on the same figures, to DIR/claims-<pid>.jsonl, so the
notebook tests' own run also answers whether each claim can fail. LABKIT_CLAIMS_STRICT=1 (the notebook tests) raises
`ClaimFailed` on a failed claim, after printing it. `labkit run` collects every claim into its summary.
Prose never types a measured figure: the claim's printed line is where the figure appears.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from labkit import stats
from labkit.figures import display_entry, entries_in, fmt_value

MIME = "application/vnd.labkit.claim+json"

HELD, DIFFERS, FAILED, INCONCLUSIVE, SKIPPED = "held", "differs", "failed", "inconclusive", "skipped"
STATUSES = (HELD, DIFFERS, FAILED, INCONCLUSIVE, SKIPPED)
MARK = {HELD: "HOLDS", DIFFERS: "DIFFERS (diagnosed)", FAILED: "FAILED", INCONCLUSIVE: "INCONCLUSIVE",
        SKIPPED: "SKIPPED"}

claims: dict[str, dict[str, Any]] = {}
_load: stats.HostLoad | None = None


class ClaimFailed(AssertionError):
    """A claim failed while LABKIT_CLAIMS_STRICT=1 (the notebook tests): no diagnosis measured here explains it."""


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def inverted() -> bool:
    """Whether every claim's test is inverted (LABKIT_CLAIMS_INVERT=1): the check that each claim can fail."""
    return _flag("LABKIT_CLAIMS_INVERT")


def _number(key: str, value: Any) -> Any:
    if hasattr(value, "item"):  # a 0-d tensor or numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    if not isinstance(value, (int, float, str, bool)):
        raise TypeError(f"figure {key!r} must be a number, a string, labkit.Samples or a labkit.Timing, "
                        f"not {type(value).__name__}")
    return value


def _as_samples(value: Any) -> stats.Samples | None:
    if isinstance(value, stats.Samples):
        return value
    as_samples = getattr(value, "as_samples", None)  # a labkit.Timing (milliseconds)
    return as_samples() if callable(as_samples) else None


def _figures(figures: Mapping[str, Any] | None) -> tuple[dict[str, dict[str, Any]], dict[str, stats.Samples]]:
    """{"pinned": (55.1, "GB/s"), "t": (timing, "ms"), "n": 8} -> recorded figures, and the sampled ones."""
    out: dict[str, dict[str, Any]] = {}
    sampled: dict[str, stats.Samples] = {}
    for key, fig in (figures or {}).items():
        value, unit = fig if isinstance(fig, tuple) else (fig, "")
        s = _as_samples(value)
        if s is not None:
            sampled[key] = s
            out[key] = {"value": s.median, "unit": unit, "p20": s.p20, "p80": s.p80, "n": s.n}
        else:
            out[key] = {"value": _number(key, value), "unit": unit}
    return out, sampled


def _measured_text(figs: Mapping[str, Mapping[str, Any]]) -> str:
    parts = []
    for k, f in figs.items():
        unit = f" {f['unit']}" if f.get("unit") else ""
        text = f"{k} {fmt_value(f['value'])}{unit}"
        if "n" in f:
            text += f" (p20-p80 {fmt_value(f['p20'])}-{fmt_value(f['p80'])}, n={f['n']})"
        parts.append(text)
    return ", ".join(parts)


@dataclass
class Diagnosis:
    """An explanation of a claim that did not hold, as a check measured on this machine."""

    name: str
    says: str
    holds: bool
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "says": self.says, "holds": self.holds, "figures": self.figures}

    def text(self) -> str:
        figs = _measured_text(self.figures)
        return f"{self.name}: {self.says}" + (f" ({figs})" if figs else "")


def diagnosis(name: str, says: str | Callable[[], str], holds: bool, figures: Mapping[str, Any] | None = None
              ) -> Diagnosis:
    """One possible cause of a claim's miss, checked on this machine: `holds` is the check's result (a bool
    computed from measurements of this run or this machine), `figures` what it measured, `says` the cause in
    words (or a function returning them). Pass it to `claim(..., diagnoses=[...])`."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("diagnosis() needs a non-empty name, e.g. diagnosis('l2_holds_the_buffer', ...)")
    if hasattr(holds, "item"):
        holds = bool(holds.item())
    if not isinstance(holds, bool):
        raise TypeError(f"diagnosis {name!r}: holds must be True or False (a check measured here), "
                        f"not {type(holds).__name__}")
    text = says() if callable(says) else says
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"diagnosis {name!r}: say what it explains, in words (says='...')")
    figs, sampled = _figures(figures)
    return Diagnosis(name, text, holds, figs)


def _host_busy() -> float | None:
    """Share of the machine's CPU time other processes used since the previous claim (None: unknown)."""
    global _load
    if _load is None:
        _load = stats.HostLoad()
        return None
    return _load.others_share()


def start_watching_load() -> None:
    """Begin the host-load reading the first claim is judged by (labkit.setup() calls it)."""
    global _load
    _load = stats.HostLoad()


def claim(name: str, expected: str, holds: bool | Callable[[Mapping[str, Any]], bool] | None,
          figures: Mapping[str, Any] | None = None, because: str = "",
          diagnoses: Sequence[Diagnosis] = (), needs: str = "", **unknown: Any) -> dict[str, Any]:
    """Check one prediction against this run: print the verdict, record it, return the entry.

    holds: True/False, None (skipped: say what it `needs`), or a test of the figures' values (medians where
    they have samples), which sampled figures are resampled with. diagnoses: `labkit.diagnosis(...)` checks,
    measured here, that may explain a miss; the claim DIFFERS only when one of them holds, else it FAILED.
    """
    if unknown:
        if "otherwise" in unknown:
            raise TypeError(f"claim {name!r}: otherwise= (an explanation in words) is gone: a miss is explained only "
                            "by a check measured here, diagnoses=[labkit.diagnosis(name, says, holds=...)]")
        raise TypeError(f"claim {name!r}: unknown argument(s) {', '.join(sorted(unknown))}")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("claim() needs a non-empty name, e.g. claim('pinned_faster', ...)")
    if not isinstance(expected, str) or not expected.strip():
        raise ValueError(f"claim {name!r}: say what was expected, in words (expected='...')")
    if hasattr(holds, "item"):
        holds = bool(holds.item())
    if holds is not None and not isinstance(holds, bool) and not callable(holds):
        raise TypeError(f"claim {name!r}: holds must be True, False, None (skipped) or a test of the figures "
                        f"(lambda f: ...), not {type(holds).__name__}")
    for d in diagnoses:
        if not isinstance(d, Diagnosis):
            raise TypeError(f"claim {name!r}: each diagnosis must come from labkit.diagnosis(...), "
                            f"not {type(d).__name__}")
    figs, sampled = _figures(figures)
    busy = _host_busy() if holds is not None else None  # a skipped claim leaves the load window to the next one
    measured_busy = [s.busy for s in sampled.values() if s.busy is not None]
    if busy is not None or measured_busy:  # the busiest of: since the last claim, and while each figure was timed
        busy = max([b for b in (busy, *measured_busy) if b is not None])
    invert = inverted()
    entry: dict[str, Any] = {"name": name, "expected": expected, "figures": figs,
                             "diagnoses": [d.as_dict() for d in diagnoses]}
    if invert:
        entry["inverted"] = True
    if busy is not None:
        entry["host_busy"] = round(busy, 3)
    log = not invert and bool(os.environ.get("LABKIT_CLAIMS_LOG"))
    if holds is not None:
        if callable(holds):
            values = {k: f["value"] for k, f in figs.items()}
            decision = stats.decide(holds, values, sampled, seed=name, invert=invert)
        else:
            decision = stats.Decision(holds != invert, None)
        if decision.agree is not None:
            entry["agreement"] = round(decision.agree, 3)
        if invert:
            entry["uninverted"] = decision.at_medians != invert  # what the test itself gave at the medians
        timed = any(not s.counted for s in sampled.values())  # a claim on counts alone: load cannot excuse a miss
        status, note = _verdict(decision, timed, busy, diagnoses, because, invert)
        if log:
            # the inverted test's answer on these figures: the opposite at the medians, as firm (every bootstrap
            # draw flips with it), judged by the same rules (the load, the diagnoses measured here)
            flipped = stats.Decision(not decision.at_medians, decision.agree, decision.too_few)
            inv_status, inv_note = _verdict(flipped, timed, busy, diagnoses, because, True)
            inverted_verdict = dict(status=inv_status, note=inv_note, uninverted=decision.at_medians)
    else:
        status, note = SKIPPED, needs or "the hardware it needs is missing here"
        inverted_verdict = dict(status=status, note=note)  # inverted or not, a skipped claim is skipped
    if log:
        _log(dict(entry, **inverted_verdict, inverted=True))
    entry["status"], entry["note"] = status, note
    claims[name] = entry
    lines = [f"[{MARK[status]}] {name}: expected {expected}" + ("  (test inverted: LABKIT_CLAIMS_INVERT)" if invert
                                                                else "")]
    if figs:
        lines.append(f"    measured: {_measured_text(figs)}")
    if note:
        label = {HELD: "why", SKIPPED: "needs", DIFFERS: "diagnosed here", FAILED: "why it failed",
                 INCONCLUSIVE: "undecided"}[status]
        lines.append(f"    {label}: {note}")
    display_entry("\n".join(lines), MIME, entry)
    if status == FAILED and _flag("LABKIT_CLAIMS_STRICT") and not invert:
        measured = f"; measured: {_measured_text(figs)}" if figs else ""
        raise ClaimFailed(f"claim {name!r} failed: expected {expected}{measured}; {note}")
    return entry


def _log(inverted_entry: dict[str, Any]) -> None:
    """Append a claim as its inverted test judged it to LABKIT_CLAIMS_LOG/claims-<pid>.jsonl, with the notebook
    the test session named (LABKIT_NOTEBOOK)."""
    line = json.dumps({"notebook": os.environ.get("LABKIT_NOTEBOOK", ""), "claim": inverted_entry}, default=str)
    with open(os.path.join(os.environ["LABKIT_CLAIMS_LOG"], f"claims-{os.getpid()}.jsonl"), "a") as f:
        f.write(line + "\n")


def _verdict(decision: stats.Decision, timed: bool, busy: float | None, diagnoses: Sequence[Diagnosis],
             because: str, invert: bool = False) -> tuple[str, str]:
    if decision.too_few:
        return INCONCLUSIVE, (f"too few samples to tell an effect from noise ({', '.join(decision.too_few)}: under "
                              f"{stats.MIN_SAMPLES}); take more")
    if not decision.decided:
        return INCONCLUSIVE, (f"the spread cannot decide it: {decision.agree:.0%} of resampled medians agree with "
                              f"the medians' answer (needs {stats.AGREE:.0%}); rerun on a quiet machine")
    loaded = timed and busy is not None and busy > stats.BUSY_SHARE
    busy_note = (f"the host was busy: other processes used {busy:.0%} of this machine's CPU time while it was "
                 "measured; rerun on a quiet machine") if loaded else ""
    if decision.at_medians:
        # inverted, a test that holds means the real one missed: on a loaded host that miss is noise, as below
        return (INCONCLUSIVE, busy_note) if invert and loaded else (HELD, because)
    if loaded:
        return INCONCLUSIVE, busy_note
    found = [d for d in diagnoses if d.holds]
    if found:
        return DIFFERS, "; ".join(d.text() for d in found)
    if diagnoses:
        return FAILED, "no diagnosis holds here (checked: " + "; ".join(d.text() for d in diagnoses) + ")"
    return FAILED, "it did not hold, and no diagnosis was offered: rerun, or report it"


def skip(name: str, expected: str, needs: str) -> dict[str, Any]:
    """Record a claim this machine cannot check (e.g. needs="a CUDA GPU")."""
    return claim(name, expected, None, needs=needs)


def guess(value: float | None, measured: float, unit: str = "", within: float = 2.0) -> bool | None:
    """Compare a student's prediction with the measurement; None (and a nudge) when no guess was written."""
    if value is None:
        print(f"no prediction written (measured {fmt_value(measured)} {unit}): set your guess in the cell "
              "before running it; a prediction you can get wrong is what makes the model stick.")
        return None
    if measured == 0 or value == 0:
        ok = value == measured
    else:
        ratio = max(value / measured, measured / value) if value * measured > 0 else math.inf
        ok = ratio <= within
    print(f"your guess {fmt_value(value)} {unit} vs measured {fmt_value(measured)} {unit}: "
          + (f"within {within:g}x, well predicted." if ok else f"more than {within:g}x off; read on for why."))
    return ok


def claims_in(notebook: dict) -> dict[str, dict[str, Any]]:
    """The claims recorded in an executed notebook (a dict as nbformat reads it)."""
    return entries_in(notebook, MIME)


def tally(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """How many claims held, differ (diagnosed), failed, were inconclusive and were skipped."""
    counts = dict.fromkeys(STATUSES, 0)
    for e in entries.values():
        status = e.get("status", FAILED)
        counts[status] = counts.get(status, 0) + 1
    return counts
