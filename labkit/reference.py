"""Reference runs, read side: another machine's measured figures, claims and plots, committed as data.

A reference run is `labkit run -p quick false` on a GPU host, saved with `labkit run --reference`
(labkit.tools.run writes it) into `reference/<machine>/` (summary.json plus each notebook's tagged plots
as PNG) after each notebook, so a batch stopped by a time limit keeps what finished. Each entry records the
commit it ran from; on a host handed a copy of the tree, set LABKIT_SOURCE_COMMIT (see `paths.source_commit`).
Notebooks call `show(...)` so a student without a GPU sees a real GPU's results, labelled as such.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from labkit import claimnames
from labkit.figures import fmt_value
from labkit.paths import COURSE_ROOT, NOTEBOOKS_DIR

ROOT = COURSE_ROOT / "reference"
PENDING = "pending.json"  # per run: the notebooks' claims it has not verified (`labkit reference pending`)
NOT_VERIFIED = "not yet verified here"


def runs(root: Path = ROOT) -> list[Path]:
    """The committed reference runs (folders holding a summary.json), newest machine name first."""
    return sorted((p.parent for p in root.glob("*/summary.json")), reverse=True)


def by_notebook(root: Path = ROOT) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """notebook stem -> (its entry, its run's summary), from every reference run that holds it: a run on one
    GPU before one on several, then the newest (a multi-GPU folder may hold a single notebook)."""
    found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for run in runs(root):
        summary = load(run)
        rank = (gpu_count(summary.get("machine", {})), str(summary.get("finished", "")))
        for entry in summary.get("notebooks", []):
            stem = Path(entry["notebook"]).stem
            old = found.get(stem)
            if old is None or rank[0] < gpu_count(old[1].get("machine", {})) or (
                    rank[0] == gpu_count(old[1].get("machine", {})) and rank[1] > str(old[1].get("finished", ""))):
                found[stem] = (entry, summary)
    return found


def load(run: Path) -> dict[str, Any]:
    """A reference run's summary as data."""
    return json.loads((run / "summary.json").read_text())


def notebook_entry(summary: dict[str, Any], notebook: str) -> dict[str, Any] | None:
    """The summary entry of one notebook, by file name or stem (e.g. '04_bottlenecks')."""
    stem = Path(notebook).stem
    for entry in summary.get("notebooks", []):
        if Path(entry["notebook"]).stem == stem:
            return entry
    return None


def compare(entry: dict[str, Any], notebook: Path) -> tuple[list[str], list[str]]:
    """(stale, unverified) for one notebook's entry in a run: the claims it recorded that the notebook no longer
    makes, and the names the notebook makes that it neither recorded nor ran without making (`not_made_here`:
    the run executed this notebook and its machine took another branch, e.g. a CPU-only claim)."""
    names = claimnames.in_notebook(notebook)
    recorded = list(entry.get("claims", {}))
    stale = [r for r in recorded if not any(n.matches(r) for n in names)]
    elsewhere = set(entry.get("not_made_here", []))
    unverified = [n.text for n in names if n.text not in elsewhere and not any(n.matches(r) for r in recorded)]
    return stale, unverified


def pending_now(run: Path, notebooks: Path = NOTEBOOKS_DIR) -> dict[str, Any]:
    """What a run's pending.json must say for the notebooks as they are now (`labkit reference pending` writes
    it): per notebook it holds, the claims not yet verified on its machine; the course's notebooks it lacks."""
    summary = load(run)
    held = {Path(e["notebook"]).stem: e for e in summary.get("notebooks", [])}
    claims = {stem: compare(e, notebooks / f"{stem}.ipynb")[1] for stem, e in sorted(held.items())
              if (notebooks / f"{stem}.ipynb").is_file()}
    return {"about": "Claims the notebooks make that this reference run has not verified on its machine (they are "
                     "new or renamed since it ran), and the notebooks it does not hold. Written by `labkit reference "
                     "pending` from the notebooks and summary.json; rerunning it changes nothing until either does.",
            "claims": {stem: names for stem, names in claims.items() if names},
            "notebooks_not_run": sorted(p.stem for p in notebooks.glob("[0-9]*.ipynb") if p.stem not in held)}


def pending(run: Path) -> dict[str, Any]:
    """A run's committed pending.json (empty lists where it has none)."""
    path = run / PENDING
    return json.loads(path.read_text()) if path.is_file() else {"claims": {}, "notebooks_not_run": []}


def gpu_count(machine: dict[str, Any]) -> int:
    return int(machine.get("GPUs", 1) or 1)


def machine_label(summary: dict[str, Any]) -> str:
    m = summary.get("machine", {})
    gpu = m.get("GPU", "unknown machine")
    if gpu_count(m) > 1:
        gpu = f"{gpu_count(m)} x {gpu}"
    parts = [gpu] + [f"{k} {m[k]}" for k in ("torch", "triton") if k in m]
    when = summary.get("finished", "")[:10]
    return ", ".join(parts) + (f", run {when}" if when else "")


def show(notebook: str, figures: Iterable[str] | None = None, plots: Iterable[str] = (),
         root: Path = ROOT) -> bool:
    """Print a reference run's figures and claims for this notebook and display its plots.

    `figures` picks figure names (all when None); `plots` names plot cells by their `plot:NAME` tag.
    Returns False (after one line saying so) when no reference run holds this notebook.
    """
    shown = False
    for run in runs(root):
        summary = load(run)
        entry = notebook_entry(summary, notebook)
        if entry is None:
            continue
        shown = True
        label = machine_label(summary)
        print(f"Reference run on another machine ({label}); these are its measurements, not yours:")
        wanted = list(figures) if figures is not None else list(entry.get("figures", {}))
        for name in wanted:
            f = entry.get("figures", {}).get(name)
            if f is not None:
                print(f"  {name} = {fmt_value(f['value'])} {f.get('unit', '')}".rstrip())
        for name, c in entry.get("claims", {}).items():
            if figures is None or name in wanted:
                print(f"  claim {name}: {c['status']}")
        for name in pending(run).get("claims", {}).get(Path(notebook).stem, []):
            print(f"  claim {name}: {NOT_VERIFIED} (the notebook makes it; this run predates it)")
        for plot in plots:
            png = run / Path(notebook).stem / f"{plot}.png"
            if png.is_file():
                _display_png(png, f"{plot} on {label}")
            else:
                print(f"  (no plot '{plot}' in that run)")
    if not shown:
        print(f"No reference run in {root} holds {Path(notebook).stem}; run it on a GPU host "
              f"(labkit run -p quick false --reference) to make one.")
    return shown


def _display_png(path: Path, caption: str) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
        if get_ipython() is not None:
            print(f"  [{caption}]")
            display(Image(filename=str(path)))
            return
    except ImportError:
        pass
    print(f"  plot: {path} ({caption})")
