"""`labkit reference pending`: write each reference run's pending.json, the notebooks' claims it has not verified.

It reads only the notebooks and reference/<machine>/summary.json, so it is idempotent: run it again and nothing
changes until a notebook or a reference run does. A claim a run recorded that its notebook no longer makes
fails the command (rerun that notebook on that machine), or with --drop-stale is moved out of the run's claims
into the entry's `withdrawn` list, so that no verdict is shown for code that is gone.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from labkit import claimnames, reference
from labkit.paths import NOTEBOOKS_DIR


def write_pending(run: Path, notebooks: Path = NOTEBOOKS_DIR) -> bool:
    """Write run/pending.json for the notebooks as they are now; True when its contents changed."""
    text = json.dumps(reference.pending_now(run, notebooks), indent=1) + "\n"
    path = run / reference.PENDING
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def stale_claims(run: Path, notebooks: Path = NOTEBOOKS_DIR) -> dict[str, list[str]]:
    """notebook stem -> the claims this run recorded that the notebook no longer makes."""
    found = {}
    for e in reference.load(run).get("notebooks", []):
        nb = notebooks / Path(e["notebook"]).name
        stale = reference.compare(e, nb)[0] if nb.is_file() else list(e.get("claims", {}))
        if stale:
            found[Path(nb).stem] = stale
    return found


def drop_stale(run: Path, stale: dict[str, list[str]]) -> None:
    """Move stale claims out of a run's summary into each entry's `withdrawn` list, recounting its verdicts."""
    from labkit.claims import tally

    summary = reference.load(run)
    for e in summary.get("notebooks", []):
        names = stale.get(Path(e["notebook"]).stem, [])
        if names:
            e["withdrawn"] = sorted(set(e.get("withdrawn", [])) | set(names))
            e["claims"] = {k: v for k, v in e.get("claims", {}).items() if k not in names}
            e["claim_counts"] = tally(e["claims"])
    (run / "summary.json").write_text(json.dumps(summary, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labkit reference", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["pending"], help="pending: write reference/<machine>/pending.json")
    ap.add_argument("machines", nargs="*", help="reference folders (e.g. nvidia-h200; default: all)")
    ap.add_argument("--root", type=Path, default=reference.ROOT, help="the reference folder (default: reference/)")
    ap.add_argument("--notebooks", type=Path, default=NOTEBOOKS_DIR, help="the notebooks (default: notebooks/)")
    ap.add_argument("--drop-stale", action="store_true",
                    help="withdraw claims a run recorded that its notebook no longer makes, instead of failing")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if any pending.json is out of date")
    args = ap.parse_args(argv)

    runs = [args.root / m for m in args.machines] if args.machines else reference.runs(args.root)
    missing = [str(r) for r in runs if not (r / "summary.json").is_file()]
    if missing:
        ap.error(f"no reference run (summary.json) in {', '.join(missing)}; see `ls {args.root}`")
    bad = 0
    for run in runs:
        try:
            stale = stale_claims(run, args.notebooks)
        except claimnames.UnreadableClaimName as exc:
            ap.error(str(exc))
        if stale and args.drop_stale and not args.check:
            drop_stale(run, stale)
            print(f"{run.name}: withdrew {sum(map(len, stale.values()))} claim(s) the notebooks no longer make: "
                  + "; ".join(f"{nb}: {', '.join(n)}" for nb, n in stale.items()))
        elif stale:
            bad += 1
            print(f"{run.name}: recorded claims the notebooks no longer make: "
                  + "; ".join(f"{nb}: {', '.join(n)}" for nb, n in stale.items())
                  + ". Rerun those notebooks on that machine (labkit run -p quick false --reference), or pass "
                    "--drop-stale to withdraw them.")
            continue
        if args.check:
            now = json.dumps(reference.pending_now(run, args.notebooks), indent=1) + "\n"
            path = run / reference.PENDING
            if not path.is_file() or path.read_text() != now:
                bad += 1
                print(f"{run.name}: {reference.PENDING} is out of date; run `labkit reference pending {run.name}`")
            continue
        changed = write_pending(run, args.notebooks)
        p = reference.pending(run)
        print(f"{run.name}: {sum(map(len, p['claims'].values()))} claim(s) {reference.NOT_VERIFIED} in "
              f"{len(p['claims'])} notebook(s), {len(p['notebooks_not_run'])} notebook(s) not run"
              + ("" if changed else " (unchanged)"))
    return 1 if bad else 0
