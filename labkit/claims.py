"""Claims: a notebook's prediction checked against this run, with the verdict printed and recorded.

    labkit.claim("pinned_faster", "pinned host->device copies beat pageable ones at 1 GiB",
                 holds=pinned > 1.5 * pageable,
                 figures={"pinned": (pinned, "GB/s"), "pageable": (pageable, "GB/s")},
                 otherwise="this host's memcpy into the staging buffer keeps up with the link")

prints one line (expected, measured, verdict) and, when the claim does not hold, the explanation
that fits this machine. `labkit run` collects every claim of a notebook into its summary.
Prose never types a measured figure: the claim's printed line is where the figure appears.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from labkit.figures import display_entry, entries_in, fmt_value

MIME = "application/vnd.labkit.claim+json"

HELD, DIFFERS, FAILED, SKIPPED = "held", "differs", "failed", "skipped"
MARK = {HELD: "HOLDS", DIFFERS: "DIFFERS (explained below)", FAILED: "DOES NOT HOLD", SKIPPED: "SKIPPED"}

claims: dict[str, dict[str, Any]] = {}

def _figures(figures: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """{"pinned": (55.1, "GB/s")} or {"n": 8} -> {"pinned": {"value": 55.1, "unit": "GB/s"}, ...}."""
    out: dict[str, dict[str, Any]] = {}
    for key, fig in (figures or {}).items():
        value, unit = fig if isinstance(fig, tuple) else (fig, "")
        if hasattr(value, "item"):  # a 0-d tensor or numpy scalar
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)
        if not isinstance(value, (int, float, str, bool)):
            raise TypeError(f"claim figure {key!r} must be a number or a string, not {type(value).__name__}")
        out[key] = {"value": value, "unit": unit}
    return out


def _measured_text(figs: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{k} {fmt_value(f['value'])}{(' ' + f['unit']) if f['unit'] else ''}" for k, f in figs.items())


def claim(name: str, expected: str, holds: bool | None, figures: Mapping[str, Any] | None = None,
          because: str = "", otherwise: str | Callable[[], str] = "", needs: str = "") -> dict[str, Any]:
    """Check one prediction against this run: print the verdict, record it, return the entry.

    holds=None marks the claim skipped (say what it `needs`). `otherwise` is the explanation that
    fits a machine where the claim does not hold (a string, or a function returning one, so it can
    quote the figures); with it the claim is an expected difference, without it a failure.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("claim() needs a non-empty name, e.g. claim('pinned_faster', ...)")
    if not isinstance(expected, str) or not expected.strip():
        raise ValueError(f"claim {name!r}: say what was expected, in words (expected='...')")
    if holds is not None and not isinstance(holds, bool):
        if hasattr(holds, "item"):
            holds = bool(holds.item())
        else:
            raise TypeError(f"claim {name!r}: holds must be True, False or None (skipped), not {type(holds).__name__}")
    figs = _figures(figures)
    why = otherwise() if callable(otherwise) else otherwise
    if holds is None:
        status, note = SKIPPED, needs or "the hardware it needs is missing here"
    elif holds:
        status, note = HELD, because
    else:
        status, note = (DIFFERS, why) if why else (FAILED, "no explanation recorded: rerun, or report it")
    entry = {"name": name, "status": status, "expected": expected, "figures": figs, "note": note}
    claims[name] = entry
    lines = [f"[{MARK[status]}] {name}: expected {expected}"]
    if figs:
        lines.append(f"    measured: {_measured_text(figs)}")
    if note:
        lines.append(f"    {'why here' if status in (DIFFERS, FAILED) else 'why' if status == HELD else 'needs'}: {note}")
    display_entry("\n".join(lines), MIME, entry)
    return entry


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
    """How many claims held, differ (explained), failed and were skipped."""
    counts = {HELD: 0, DIFFERS: 0, FAILED: 0, SKIPPED: 0}
    for e in entries.values():
        counts[e.get("status", FAILED)] = counts.get(e.get("status", FAILED), 0) + 1
    return counts
