"""`labkit run`: execute notebooks in batch with papermill and collect their figures.

Each notebook runs into the build folder with the given parameters; a failing notebook is
reported and the batch goes on. The summary is written as summary.json (data) and
summary.md (for people); the exit code is non-zero when any notebook failed.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from labkit.figures import figures_in

COURSE_ROOT = Path(__file__).resolve().parent.parent


def default_notebooks() -> list[Path]:
    """The course's notebooks in order (the index is only links)."""
    return sorted(p for p in (COURSE_ROOT / "notebooks").glob("[0-9]*.ipynb"))


def parse_value(text: str):
    """A -p value as papermill would take it: JSON where it parses (1, 0.5, true, null), else a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def run_one(path: Path, out_dir: Path, parameters: dict, timeout_s: float | None) -> dict:
    """Execute one notebook; return its summary entry (never raises for a notebook's failure)."""
    import nbformat
    import papermill

    out_path = out_dir / path.name
    started = time.perf_counter()
    entry = {"notebook": str(path), "output": str(out_path), "status": "ok", "error": None}
    try:
        papermill.execute_notebook(str(path), str(out_path), parameters=parameters, cwd=str(path.parent),
                                   progress_bar=False, execution_timeout=timeout_s,
                                   kernel_name="python3")
    except Exception as exc:  # papermill raises PapermillExecutionError, and others for broken files
        entry["status"] = "failed"
        ename = getattr(exc, "ename", type(exc).__name__)
        evalue = getattr(exc, "evalue", str(exc))
        cell = getattr(exc, "exec_count", None)
        entry["error"] = f"{ename}: {evalue}" + (f" (cell [{cell}])" if cell is not None else "")
    entry["duration_s"] = round(time.perf_counter() - started, 2)
    entry["figures"] = figures_in(nbformat.read(out_path, as_version=4)) if out_path.exists() else {}
    return entry


def write_summary(entries: list[dict], out_dir: Path, parameters: dict) -> None:
    """summary.json for machines, summary.md for people."""
    (out_dir / "summary.json").write_text(json.dumps({"parameters": parameters, "notebooks": entries}, indent=1))
    lines = ["# Batch run", "", f"Parameters: `{json.dumps(parameters)}`", "",
             "| notebook | status | seconds | error |", "|---|---|---|---|"]
    for e in entries:
        err = (e["error"] or "").replace("|", "\\|").replace("\n", " ")[:300]
        lines.append(f"| {Path(e['notebook']).name} | {e['status']} | {e['duration_s']:.1f} | {err} |")
    for e in entries:
        if e["figures"]:
            lines += ["", f"## {Path(e['notebook']).name}", "", "| figure | value | unit |", "|---|---|---|"]
            lines += [f"| {f['name']} | {f['value']} | {f['unit']} |" for f in e["figures"].values()]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labkit run", description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: all of notebooks/)")
    ap.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="a parameter for every notebook, e.g. -p quick true -p device cuda")
    ap.add_argument("-o", "--output", type=Path, default=Path("build"), help="build folder (default: build/)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds allowed per cell")
    args = ap.parse_args(argv)

    notebooks = args.notebooks or default_notebooks()
    missing = [str(p) for p in notebooks if not p.is_file()]
    if missing:
        ap.error(f"no such notebook: {', '.join(missing)}")
    parameters = {name: parse_value(value) for name, value in args.parameter}
    args.output.mkdir(parents=True, exist_ok=True)
    taken = {p.name for p in notebooks}
    if len(taken) < len(notebooks):
        ap.error("two notebooks share a file name; they would overwrite each other in the build folder")

    from tqdm.auto import tqdm

    entries = []
    bar = tqdm(notebooks, desc="notebooks", unit="nb")
    for path in bar:
        bar.set_postfix_str(path.name)
        entry = run_one(path, args.output, parameters, args.timeout)
        entries.append(entry)
        tqdm.write(f"{entry['status']:>6}  {path.name}  {entry['duration_s']:.1f} s"
                   + (f"  {entry['error'][:200]}" if entry["error"] else ""))
    write_summary(entries, args.output, parameters)
    failed = sum(e["status"] != "ok" for e in entries)
    print(f"{len(entries) - failed} ok, {failed} failed; summary in {args.output / 'summary.md'}")
    return 1 if failed else 0
