"""The pages `labkit book` writes itself: the run's banner, the index's run table and the claims on every machine.

Everything here reads summary.json data (a `labkit run` folder's, and the committed reference/*/summary.json) and
returns text (HTML or MyST Markdown); labkit.tools.book lays it into the book's source.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit import claims as claims_mod
from labkit import reference
from labkit.figures import fmt_value

CLAIMS_DOC = "claims"  # the per-machine claims page, at the book's top level


@dataclass
class Run:
    """One machine's run as the claims page shows it: this book's own run, or a committed reference run."""

    summary: dict[str, Any]
    own: bool  # True: the run this book shows; False: a reference run from reference/

    @property
    def machine(self) -> dict[str, Any]:
        return self.summary.get("machine", {})

    @property
    def is_gpu(self) -> bool:
        return self.machine.get("GPU", "none") not in ("none", None, "")

    @property
    def title(self) -> str:
        """A column header: the machine, and whose run it is."""
        m = self.machine
        if self.is_gpu:
            name = str(m["GPU"]) if reference.gpu_count(m) == 1 else f"{reference.gpu_count(m)} x {m['GPU']}"
        else:
            name = f"CPU ({m.get('CPU', 'unknown')})"
        size = "quick run" if self.summary.get("quick") else "full size"
        return f"{name}, {size}" + (" (this book's run)" if self.own else " (reference)")

    def entries(self) -> dict[str, dict[str, Any]]:
        """notebook stem -> its summary entry."""
        return {Path(e["notebook"]).stem: e for e in self.summary.get("notebooks", [])}


def short_date(when: str | None) -> str:
    """'2026-11-26T00:56:24+00:00' -> '2026-11-26 00:56 UTC' (as recorded, when it has another form)."""
    m = re.match(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d)", when or "")
    return f"{m.group(1)} {m.group(2)} UTC" if m else (when or "an unrecorded date")


def banner(summary: dict[str, Any], built_from: str) -> str:
    """The line on top of every page (HTML): which machine ran these outputs, with what, when, at which commit."""
    run = Run(summary, own=True)
    m = run.machine
    versions = ", ".join(f"{k} {m[k]}" for k in ("torch", "triton", "Python") if m.get(k))
    commit = summary.get("commit") or "not recorded by this run"
    when = short_date(summary.get("finished"))
    if run.is_gpu:
        gpus = reference.gpu_count(m)
        what = (f"<b>Outputs of a {'full-size' if not summary.get('quick') else 'quick (small sizes)'} run on "
                f"{html.escape(str(m['GPU']))}</b> ({gpus} GPU{'s' if gpus > 1 else ''}, driver "
                f"{html.escape(str(m.get('driver', '?')))})")
    else:
        what = (f"<b>Outputs of a CPU quick run, not a GPU's:</b> small sizes on {html.escape(str(m.get('CPU', '?')))} "
                f"({html.escape(str(m.get('CPU cores', '?')))} cores, Triton's interpreter); the GPUs' verdicts are "
                f"on the page <i>Claims on each machine</i>")
    return (f"{what}; {html.escape(versions)}; finished {when}; course commit {html.escape(commit)}. "
            f"Book built from commit {html.escape(built_from)}.")


def run_table(summary: dict[str, Any], titles: dict[str, str]) -> str:
    """A Markdown table of this run's notebooks: status, seconds and claim verdicts (for the index page)."""
    rows = ["| notebook | status | seconds | held / differ / failed / inconclusive / skipped |", "|---|---|---|---|"]
    for stem, e in sorted(Run(summary, own=True).entries().items()):
        k = {**claims_mod.tally({}), **(e.get("claim_counts") or {})}
        counts = " / ".join(str(k[s]) for s in claims_mod.STATUSES)
        status = e.get("status", "?") if not e.get("error") else f"{e.get('status')}: {e['error']}"
        rows.append(f"| [{_md(titles.get(stem, stem))}]({stem}.ipynb) | {_md(status)[:200]} "
                    f"| {e.get('duration_s', 0):.1f} | {counts} |")
    return "\n".join(rows)


def _md(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def key_figure(claim: dict[str, Any]) -> str:
    """A claim's first figure as text ('pinned 55.1 GB/s (p20-p80 54.9-55.3)'), with how many more it has."""
    figs = claim.get("figures") or {}
    if not figs:
        return ""
    name, f = next(iter(figs.items()))
    text = f"{name} {fmt_value(f.get('value'))} {f.get('unit', '')}".rstrip()
    if "p20" in f and "p80" in f:
        text += f" (p20-p80 {fmt_value(f['p20'])}-{fmt_value(f['p80'])})"
    return text + (f" (+{len(figs) - 1} more)" if len(figs) > 1 else "")


def _cell(claim: dict[str, Any] | None) -> str:
    if claim is None:
        return '<td class="claim-absent">not in this run</td>'
    status = claim.get("status", claims_mod.FAILED)
    tip = claims_mod._measured_text(claim.get("figures") or {})
    if claim.get("note"):
        tip += ("\n" if tip else "") + str(claim["note"])
    return (f'<td title="{html.escape(tip)}"><span class="verdict verdict-{html.escape(status)}">'
            f'{html.escape(claims_mod.MARK.get(status, status.upper()))}</span> '
            f'<span class="key-figure">{html.escape(key_figure(claim))}</span></td>')


def claims_table(stem: str, runs: list[Run]) -> str:
    """One notebook's claims (rows) on each machine (columns): verdict and key figure, as one HTML table."""
    per_run = [(r.entries().get(stem) or {}).get("claims") or {} for r in runs]
    names: list[str] = []
    for claims in per_run:
        names += [n for n in claims if n not in names]
    expected = {n: next(c[n].get("expected", "") for c in per_run if n in c) for n in names}
    head = "".join(f"<th>{html.escape(r.title)}<br><small>{html.escape(short_date(r.summary.get('finished')))}"
                   f"</small></th>" for r in runs)
    rows = [f'<tr><th scope="row"><code>{html.escape(n)}</code><br><small>{html.escape(expected[n])}</small></th>'
            + "".join(_cell(c.get(n)) if (r.entries().get(stem) is not None) else '<td class="claim-absent">'
                      'notebook not in this run</td>' for r, c in zip(runs, per_run)) + "</tr>" for n in names]
    # one HTML block without blank lines (Markdown ends a raw HTML block at the first blank line)
    return (f'<div class="claims-scroll"><table class="claims-by-machine" data-notebook="{html.escape(stem)}"><thead>'
            f"<tr><th>claim</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def claims_page(runs: list[Run], stems: list[str], titles: dict[str, str]) -> str:
    """The MyST page that sets each notebook's claims side by side on every machine."""
    lines = ["# Claims on each machine", "",
             "Each notebook states its predictions as claims, checked against the run that executed it "
             "(`labkit.claim`; CONTRIBUTING.md says how a verdict is decided). Here every claim stands beside its "
             "verdict on each machine: this book's run and the reference runs committed in `reference/`. "
             "A cell shows the verdict and the claim's first figure; hover it for all its figures and the reason.",
             "", "## The runs", "",
             "| machine | finished | notebooks | held | differ | failed | inconclusive | skipped |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        k = claims_mod.tally({f"{s}:{n}": c for s, e in r.entries().items()
                              for n, c in (e.get("claims") or {}).items()})
        lines.append(f"| {_md(r.title)} | {short_date(r.summary.get('finished'))} | {len(r.entries())} | "
                     + " | ".join(str(k[s]) for s in claims_mod.STATUSES) + " |")
    lines += [""] + [f"- **{_md(r.title)}**: {_md(r.summary['about'])}" for r in runs if r.summary.get("about")]
    for stem in stems:
        if not any(stem in r.entries() for r in runs):
            continue
        lines += ["", f"({anchor(stem)})=", f"## [{_md(titles.get(stem, stem))}](notebooks/{stem}.ipynb)", "",
                  claims_table(stem, runs)]
    return "\n".join(lines) + "\n"


def anchor(stem: str) -> str:
    """The label of a notebook's section on the claims page (for {ref} links from its page)."""
    return "claims-" + re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")


def reference_runs(root: Path = reference.ROOT) -> list[Run]:
    """The committed reference runs, one GPU before several, then by machine name."""
    found = [Run(reference.load(p), own=False) for p in reference.runs(root)]
    return sorted(found, key=lambda r: (reference.gpu_count(r.machine), str(r.machine.get("GPU", ""))))
