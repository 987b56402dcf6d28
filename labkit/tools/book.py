"""`labkit book`: the course as a static HTML book, built from the executed notebooks of `labkit run` folders.

    labkit book build/gpu/run                     # one run folder (its summary.json and executed notebooks)
    labkit book shard-1/run shard-2/run -o OUT    # the shards of one machine's run, as GPU CI makes them

Sphinx with MyST-NB (execution off: the notebooks are shown as the run left them) and the Sphinx Book Theme,
MathML for the math (labkit.tools.book_math): nothing is fetched at build or view time. Every page names the
machine, versions, date and commit of the run; a page sets each claim's verdict on this run beside the
committed reference runs. `python3 course.py book` installs the tools (locks/book.txt) and calls this.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat

from labkit import paths
from labkit.paths import COURSE_ROOT, child_env, course_notebooks
from labkit.tools import book_pages, nbio

TOOLS = ("sphinx", "myst_nb", "sphinx_book_theme", "latex2mathml")
CSS = """
.claims-by-machine { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }
.claims-by-machine th, .claims-by-machine td { border: 1px solid var(--pst-color-border, #ccc); padding: 0.3em 0.5em;
  vertical-align: top; text-align: left; }
.claims-by-machine tbody th { font-weight: normal; max-width: 26em; }
.verdict { font-weight: bold; padding: 0 0.3em; border-radius: 3px; white-space: nowrap; }
.verdict-held { background: #d7f5dd; color: #14532d; }
.verdict-differs { background: #dbeafe; color: #1e3a8a; }
.verdict-failed { background: #fde2e2; color: #7f1d1d; }
.verdict-inconclusive { background: #fef3c7; color: #78350f; }
.verdict-skipped { background: #e5e7eb; color: #374151; }
.claim-absent { color: #6b7280; font-style: italic; }
.math-display { overflow-x: auto; margin: 0.5em 0; }
.claims-scroll { overflow-x: auto; }
/* the claims page has no right-hand contents column (conf.py): its tables take the page's width */
.bd-main .bd-content .bd-article-container:has(.claims-by-machine) { max-width: 100%; }
"""
REDIRECT = ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>Making deep learning fast on GPUs</title>'
            '<meta http-equiv="refresh" content="0; url=notebooks/index.html"></head><body>'
            '<a href="notebooks/index.html">Making deep learning fast on GPUs</a></body></html>\n')


class RunFolderError(ValueError):
    """A folder given is not a `labkit run` output, or the folders do not make one run: the message says why."""


def run_folders(folders: list[Path]) -> list[Path]:
    """The run folders given: each folder holding a summary.json, or else the folders inside it that hold one (a
    batch run one notebook at a time, each into its own folder)."""
    found = []
    for folder in folders:
        inner = sorted(p.parent for p in folder.glob("*/summary.json"))
        if not (folder / "summary.json").is_file() and not inner:
            raise RunFolderError(f"{folder} holds no summary.json: give a folder `labkit run -o FOLDER` wrote "
                                 "(its executed notebooks and summary.json), or run `python3 course.py book` "
                                 "without a folder to make a quick run first")
        found += [folder] if (folder / "summary.json").is_file() else inner
    return found


def load_runs(folders: list[Path]) -> tuple[dict[str, Any], dict[str, Path]]:
    """The merged summary of one machine's run folders (shards) and each executed notebook by stem."""
    summaries, executed = [], {}
    for folder in run_folders(folders):
        path = folder / "summary.json"
        try:
            summary = json.loads(path.read_text())
        except ValueError as exc:
            raise RunFolderError(f"{path} is not JSON ({exc}): was the run interrupted? Run it again") from None
        for e in summary.get("notebooks", []):
            stem = Path(e["notebook"]).stem
            if stem in executed:
                raise RunFolderError(f"{stem} is in two of the folders given ({executed[stem].parent} and {folder}): "
                                     "give each notebook's run once")
            out = folder / Path(e.get("output") or e["notebook"]).name
            executed[stem] = out  # may be missing: a notebook that failed before papermill wrote it
            e.setdefault("finished", summary.get("finished"))  # each shard's own date
        summaries.append(summary)
    machines = {(s.get("machine", {}).get("GPU"), s.get("machine", {}).get("GPUs"), s.get("quick")) for s in summaries}
    if len(machines) > 1:
        raise RunFolderError(f"the folders come from different machines or sizes ({sorted(map(str, machines))}): "
                             "a book shows one machine's run; build one book per machine")
    merged = {**summaries[0], "notebooks": [e for s in summaries for e in s.get("notebooks", [])]}
    merged["finished"] = max(str(s.get("finished", "")) for s in summaries) or None
    commits = sorted({paths.commit_label(s) for s in summaries if s.get("commit")})
    merged["commit"] = " and ".join(commits) or None
    return merged, executed


def git_commit() -> str:
    """This checkout's commit (the book's own), as `labkit run` records a run's."""
    return paths.commit_label(paths.source_commit()) or "unknown (not a git checkout)"


def title_of(nb: dict, fallback: str) -> str:
    """A notebook's title: its first Markdown heading."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in nbio.source(cell).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return fallback


def _note(kind: str, text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(f":::{{{kind}}}\n{text}\n:::")


def page_note(stem: str, entry: dict[str, Any] | None, executed: bool,
              summary: dict[str, Any]) -> nbformat.NotebookNode:
    """The box under a notebook's title: where its outputs come from, its status and claims, a link to the others."""
    others = f"{{ref}}`Its claims on every machine <{book_pages.anchor(stem)}>`."
    if entry is None or not executed:
        why = "is not in this run" if entry is None else f"did not run: {entry.get('status')}: {entry.get('error')}"
        return _note("warning", f"This notebook {why}; it is shown without outputs. {others}")
    k = {s: n for s, n in (entry.get("claim_counts") or {}).items() if n}
    counts = ", ".join(f"{n} {s}" for s, n in k.items()) or "none"
    where = book_pages.Run(summary, own=True).title.replace(" (this book's run)", "")
    when = book_pages.short_date(entry.get("finished") or summary.get("finished"))
    text = (f"Outputs of this run: {where}, {entry.get('duration_s', 0):.0f} s, finished {when}. "
            f"Claims here: {counts}. {others}")
    if entry.get("status") != "ok":
        return _note("warning", f"This notebook stopped with an error in this run ({entry.get('error')}); its "
                                f"outputs end where it stopped. {text}")
    return _note("note", text)


def stage_notebook(src: Path, dest: Path, note: nbformat.NotebookNode, clear: bool) -> dict:
    nb = nbio.read(src)
    if clear:
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
    nb.cells.insert(1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0, note)
    nbformat.validator.normalize(nb)
    nbio.write(nb, dest)
    return nb


def index_notebook(src: Path, stems: list[str], exercises: list[str], about: str) -> nbformat.NotebookNode:
    """The course's index as the book's home: its prose and links (not its code: durations are the run's table),
    what this book shows, and the book's table of contents."""
    nb = nbio.read(src)
    cells = nb.cells
    kept = [c for i, c in enumerate(cells) if c.cell_type == "markdown"
            and not (i + 1 < len(cells) and cells[i + 1].cell_type == "code")]
    toc = [("The notebooks", [f"{s}" for s in stems]), ("Claims on each machine", [f"../{book_pages.CLAIMS_DOC}"]),
           ("Exercises (to do in JupyterLab)", [f"../exercises/{e}" for e in exercises])]
    trees = "\n\n".join(f"```{{toctree}}\n:hidden:\n:caption: {cap}\n\n" + "\n".join(docs) + "\n```"
                        for cap, docs in toc if docs)
    nb.cells = kept + [nbformat.v4.new_markdown_cell(about), nbformat.v4.new_markdown_cell(trees)]
    return nb


def conf_py(announcement: str) -> str:
    """Sphinx's configuration for the book (written into its source folder)."""
    return f'''# Written by `labkit book` (labkit/tools/book.py): edit that, not this.
project = "Making deep learning fast on GPUs"
extensions = ["myst_nb", "labkit.tools.book_math"]
root_doc = "notebooks/index"
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
nb_execution_mode = "off"  # executed by `labkit run`: shown as it ran
nb_ipywidgets_js = {{}}  # no require.js and widget scripts from a CDN (batch runs have no widgets)
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
html_math_renderer = "mathml"  # labkit.tools.book_math: MathML at build time, no MathJax to fetch
suppress_warnings = ["mystnb.unknown_mime_type"]  # labkit's claim and figure data, beside their text
html_theme = "sphinx_book_theme"
html_title = project
html_static_path = ["_static"]
html_css_files = ["book.css"]
html_extra_path = ["_extra"]
html_show_sourcelink = False
html_context = {{"default_mode": "auto"}}  # the reader's light or dark (unset, the theme's script logs an error)
html_theme_options = {{
    "announcement": {announcement!r},
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "secondary_sidebar_items": {{"**": ["page-toc"], "{book_pages.CLAIMS_DOC}": []}},
}}
'''


def stage(source: Path, summary: dict[str, Any], executed: dict[str, Path], reference_root: Path) -> list[str]:
    """Lay the book's source into `source`; return the notebook stems, in order."""
    shutil.rmtree(source, ignore_errors=True)
    for sub in ("notebooks", "exercises", "_static", "_extra"):
        (source / sub).mkdir(parents=True)
    entries = book_pages.Run(summary, own=True).entries()
    repo = {p.stem: p for p in course_notebooks()}
    stems = sorted(set(repo) | {s for s, p in executed.items() if p.is_file()})
    titles = {}
    for stem in stems:
        ran = executed.get(stem)
        has_run = ran is not None and ran.is_file()
        note = page_note(stem, entries.get(stem), has_run, summary)
        nb = stage_notebook(ran if has_run else repo[stem], source / "notebooks" / f"{stem}.ipynb", note,
                            clear=not has_run)
        titles[stem] = title_of(nb, stem)
    exercises = sorted(p.stem for p in (COURSE_ROOT / "exercises").glob("*.ipynb"))
    for name in exercises:
        shutil.copy(COURSE_ROOT / "exercises" / f"{name}.ipynb", source / "exercises" / f"{name}.ipynb")
    runs = [book_pages.Run(summary, own=True), *book_pages.reference_runs(reference_root)]
    (source / f"{book_pages.CLAIMS_DOC}.md").write_text(book_pages.claims_page(runs, stems, titles))
    about = "\n".join([
        "## This book", "",
        "The outputs on these pages are a `labkit run` of the notebooks, shown as that run left them: the top of "
        "every page names its machine, versions, date and commit. Executed notebooks are build products: they come "
        "from a `labkit run` folder (GPU CI's notebooks job keeps its run as an artifact and publishes this book "
        "from it); the repository commits only what a reader without a GPU needs, the reference runs' "
        "`summary.json` and plots in `reference/`. The page *Claims on each machine* sets every claim's verdict on "
        "this run beside those reference runs.", "",
        "### This run's notebooks", "", book_pages.run_table(summary, titles)])
    index = index_notebook(COURSE_ROOT / "notebooks" / "index.ipynb", stems, exercises, about)
    nbio.write(index, source / "notebooks" / "index.ipynb")
    (source / "_static" / "book.css").write_text(CSS)
    (source / "_extra" / "index.html").write_text(REDIRECT)
    (source / "conf.py").write_text(conf_py(book_pages.banner(summary, git_commit())))
    return stems


def build(source: Path, html: Path, warnings: Path) -> int:
    """Run Sphinx (a fresh build) from `source` into `html`; its warnings go to `warnings` and the screen."""
    shutil.rmtree(html, ignore_errors=True)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-E", "-q", "-w", str(warnings), "-d",
           str(source.parent / ".doctrees"), str(source), str(html)]
    return subprocess.run(cmd, env=child_env(COURSE_ROOT)).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labkit book", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, metavar="RUN_FOLDER",
                    help="a `labkit run` output folder (summary.json and executed notebooks); several: one "
                         "machine's shards")
    ap.add_argument("-o", "--output", type=Path, default=Path("build/book"),
                    help="where the book goes: OUTPUT/html (open OUTPUT/html/index.html), its source in OUTPUT/source")
    ap.add_argument("--references", type=Path, default=COURSE_ROOT / "reference",
                    help="the reference runs the claims page compares with (default: the course's reference/)")
    args = ap.parse_args(argv)
    try:
        summary, executed = load_runs(args.runs)
    except RunFolderError as exc:
        ap.error(str(exc))
    missing = [m for m in TOOLS if not _importable(m)]
    if missing:
        print(f"labkit book: the book's tools are not installed ({', '.join(missing)}): `python3 course.py book` "
              "installs them (locks/book.txt), or `pip install -e '.[book]'`", file=sys.stderr)
        return 2
    out = args.output.resolve()
    stems = stage(out / "source", summary, executed, args.references)
    shown = sum(1 for s in stems if executed.get(s) is not None and executed[s].is_file())
    print(f"labkit book: {len(stems)} notebooks ({shown} with this run's outputs); building with Sphinx")
    warnings = out / "warnings.txt"
    code = build(out / "source", out / "html", warnings)
    text = warnings.read_text() if warnings.exists() else ""
    if text.strip():
        print(f"labkit book: Sphinx warned ({warnings}):\n{text}", file=sys.stderr)
    if code != 0:
        print(f"labkit book: Sphinx failed (exit {code}); its messages are above", file=sys.stderr)
        return 1
    print(f"labkit book: done: open {out / 'html' / 'index.html'}")
    return 0


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
