"""`labkit run`: execute notebooks in batch with papermill and collect their figures.

Each notebook runs into the build folder with the given parameters; a failing notebook is
reported and the batch goes on. The summary is written as summary.json (data) and
summary.md (for people); the exit code is non-zero when any notebook failed or any claim
failed (`--allow-failed-claims` to explore without failing on claims).
"""
from __future__ import annotations

import argparse
import ast
import base64
import datetime
import difflib
import json
import os
import shutil
import time
from pathlib import Path

from labkit import claimnames
from labkit import claims as claims_mod
from labkit import paths, reference
from labkit.figures import figures_in, fmt_value
from labkit.paths import course_notebooks, machine_slug
from labkit.tools import nbio, shard


def parse_value(text: str):
    """A -p value as papermill would take it: JSON where it parses (1, 0.5, true, null), else a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


KINDS = {"int": int, "float": float, "bool": bool, "str": str, "list": list}


def declared_parameters(path: Path) -> dict[str, object]:
    """The names in a notebook's `parameters` cell and their defaults (as Python values where literal)."""
    return {name: default for name, (default, _) in declared_parameter_kinds(path).items()}


def declared_parameter_kinds(path: Path) -> dict[str, tuple[object, str | None]]:
    """name -> (default, kind) of a notebook's parameters: the kind from an annotation (`max_bytes: int = None`),
    else from a literal default, else None (unknown)."""
    import papermill

    found: dict[str, tuple[object, str | None]] = {}
    for name, p in papermill.inspect_notebook(str(path)).items():
        try:
            default = ast.literal_eval(p["default"])
        except (ValueError, SyntaxError):
            default = p["default"]  # an expression: its type is unknown
        kind = p.get("inferred_type_name")
        if kind not in KINDS:
            literal = type(default).__name__
            kind = literal if literal in KINDS and default is not None else None
        found[name] = (default, kind)
    return found


def check_parameters(parameters: dict, notebooks: list[Path]) -> dict[Path, dict]:
    """Each notebook's share of `parameters`, after refusing names no notebook declares and malformed values."""
    from labkit.device import parse_flag

    kinds = {path: declared_parameter_kinds(path) for path in notebooks}
    declared = {path: {n: d for n, (d, _) in k.items()} for path, k in kinds.items()}
    known = sorted(set().union(*declared.values())) if declared else []
    for name, value in parameters.items():
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown parameter {name!r}: no notebook here declares it.{hint} "
                             f"Known: {', '.join(known) or 'none'}.")
        if name == "quick":
            parse_flag("quick", value)
        elif name == "device":
            from labkit.device import choose_device
            try:
                choose_device(value)  # a GPU asked for where PyTorch sees none is refused here, not in cell 3
            except RuntimeError as exc:
                raise ValueError(f"parameter device={value!r}: {exc}") from None
        else:
            for kind in {k[name][1] for k in kinds.values() if name in k and k[name][1]}:
                _check_kind(name, value, kind)
    return {path: {k: v for k, v in parameters.items() if k in declared[path]} for path in notebooks}


def _check_kind(name: str, value: object, kind: str) -> None:
    """Refuse a value of another kind than the notebook declares (a word where a number goes); None always fits."""
    ok = {"bool": lambda v: isinstance(v, bool),
          "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "str": lambda v: isinstance(v, str),
          "list": lambda v: isinstance(v, list)}[kind]
    if value is not None and not ok(value):
        example = {"bool": "true", "int": "4096", "float": "1.5", "str": "text", "list": "[1024, 2048]"}[kind]
        raise ValueError(f"parameter {name}={value!r}: the notebook expects {'an' if kind == 'int' else 'a'} {kind} "
                         f"(e.g. -p {name} {example}), "
                         f"or null for its default.")


def _wants_full_size_on_cpu(parameters: dict) -> bool:
    from labkit.device import _device_param, _env_flag, parse_flag

    quick = parse_flag("quick", parameters.get("quick"))
    if quick is None:
        quick = _env_flag("LABKIT_QUICK")
    if quick is not False:
        return False
    device = _device_param(parameters.get("device")) or os.environ.get("LABKIT_DEVICE")
    if device is not None:
        return not str(device).startswith("cuda")
    import torch

    return not torch.cuda.is_available()


def _batch_kernel_manager():
    """A kernel manager for batch runs: IPC sockets where there are any (no 'TCP without encryption'
    warning on every run), and no progress bars: a notebook's tqdm.auto widget stays frozen at 0% in the
    saved copy, so the kernel swaps it for the plain tqdm, which TQDM_DISABLE=1 turns off."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import CaselessStrEnum

    class BatchKernelManager(AsyncKernelManager):
        transport = CaselessStrEnum(["tcp", "ipc"], default_value="tcp" if os.name == "nt" else "ipc", config=True)

        async def start_kernel(self, **kw):
            env = {**(kw.get("env") or os.environ), "TQDM_DISABLE": "1"}
            env.pop("LABKIT_CLAIMS_STRICT", None)  # a batch records every claim; its exit code reports failures
            kw["env"] = env
            swap = "import tqdm.auto, tqdm.std; tqdm.auto.tqdm, tqdm.auto.trange = tqdm.std.tqdm, tqdm.std.trange"
            kw["extra_arguments"] = [*(kw.get("extra_arguments") or []), f"--IPKernelApp.exec_lines={[swap]!r}"]
            return await super().start_kernel(**kw)

    return BatchKernelManager


def run_one(path: Path, out_dir: Path, parameters: dict, timeout_s: float | None) -> dict:
    """Execute one notebook; return its summary entry (never raises for a notebook's failure)."""
    import papermill

    out_path = out_dir / path.name
    started = time.perf_counter()
    entry = {"notebook": str(path), "output": str(out_path), "status": "ok", "error": None}
    try:
        papermill.execute_notebook(str(path), str(out_path), parameters=parameters, cwd=str(path.parent),
                                   progress_bar=False, execution_timeout=timeout_s,
                                   kernel_name="python3", kernel_manager_class=_batch_kernel_manager())
    except Exception as exc:  # papermill raises PapermillExecutionError, and others for broken files
        entry["status"] = "failed"
        ename = getattr(exc, "ename", type(exc).__name__)
        evalue = getattr(exc, "evalue", str(exc))
        cell = getattr(exc, "exec_count", None)
        entry["error"] = f"{ename}: {evalue}" + (f" (cell [{cell}])" if cell is not None else "")
        if cell is None and out_path.exists():  # a time-out or a dead kernel: name the cell that was running
            where = _running_cell(nbio.read(out_path))
            if where:
                entry["error"] += f" (in {where})"
    entry["duration_s"] = round(time.perf_counter() - started, 2)
    executed = nbio.read(out_path) if out_path.exists() else {}
    entry["figures"] = figures_in(executed) if executed else {}
    entry["claims"] = claims_mod.claims_in(executed) if executed else {}
    entry["claim_counts"] = claims_mod.tally(entry["claims"])
    if entry["status"] == "ok":  # it ran to the end: a name it can make but did not is another machine's claim
        entry["not_made_here"] = not_made(path, entry["claims"])
    return entry


def not_made(path: Path, recorded: dict) -> list[str]:
    """The claim names a notebook's source can make that a complete run of it did not record (a CPU-only claim
    on a GPU, a 2-GPU claim on one); [] where a name cannot be read statically (tests/test_reference.py says so)."""
    try:
        names = claimnames.in_notebook(path)
    except claimnames.UnreadableClaimName:
        return []
    return [n.text for n in names if not any(n.matches(r) for r in recorded)]


def _running_cell(executed) -> str | None:
    """Papermill marks the cell that was executing when a notebook stopped; say which one it was."""
    code_cells = [c for c in executed.get("cells", []) if c.get("cell_type") == "code"]
    for i, cell in enumerate(code_cells):
        pm = cell.get("metadata", {}).get("papermill", {})
        if pm.get("status") == "running" or pm.get("exception"):
            first = next((ln for ln in "".join(cell.get("source", "")).splitlines() if ln.strip()), "")
            return f"code cell {i + 1}: {first[:80]}"
    return None


def run_facts(parameters: dict) -> dict:
    """When, where and with what a batch ran: the machine, versions, quick mode and ceilings."""
    import labkit
    from labkit import ceilings

    facts: dict = {"finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   **paths.source_commit()}
    try:
        cfg = labkit.setup(device=parameters.get("device"), quick=parameters.get("quick"))
        facts["machine"] = labkit.machine_info()
        facts["quick"] = cfg.quick
        c = ceilings.cached()
        facts["ceilings"] = None if c is None else {"copy_gbps": c.copy_gbps, "matmul_tflops": c.matmul_tflops,
                                                   "h2d_gbps": c.h2d_gbps, "d2h_gbps": c.d2h_gbps}
    except Exception as exc:  # the summary must still be written
        facts["machine_error"] = f"{type(exc).__name__}: {exc}"
    return facts


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_summary(entries: list[dict], out_dir: Path, parameters: dict, facts: dict | None = None) -> None:
    """summary.json for machines, summary.md for people."""
    facts = facts or {}
    (out_dir / "summary.json").write_text(json.dumps({**facts, "parameters": parameters, "notebooks": entries},
                                                     indent=1))
    m = facts.get("machine", {})
    lines = ["# Batch run", "", f"Parameters: `{json.dumps(parameters)}`"]
    if m:
        lines.append(f"Machine: {m.get('GPU', 'no GPU')} / {m.get('CPU', '?')}; torch {m.get('torch', '?')}, "
                     f"triton {m.get('triton', '?')}; quick mode {facts.get('quick')}; "
                     f"finished {facts.get('finished')}")
    lines += ["", "| notebook | status | seconds | claims held / differ / failed / inconclusive / skipped | error |",
              "|---|---|---|---|---|"]
    for e in entries:
        k = {**claims_mod.tally({}), **(e.get("claim_counts") or {})}
        counts = " / ".join(str(k[s]) for s in claims_mod.STATUSES)
        lines.append(f"| {Path(e['notebook']).name} | {e['status']} | {e['duration_s']:.1f} | {counts} "
                     f"| {_cell(e['error'] or '')[:300]} |")
    failed = failed_claims(entries)
    if failed:
        lines += ["", "## Failed claims", "", "| notebook | claim | measured | why |", "|---|---|---|---|"]
        lines += [f"| {nb} | {c['name']} | {_cell(claims_mod._measured_text(c.get('figures', {})))} "
                  f"| {_cell(c.get('note', ''))[:300]} |" for nb, c in failed]
    for e in entries:
        if e.get("claims"):
            lines += ["", f"## {Path(e['notebook']).name}: claims", "", "| claim | verdict | measured | why |",
                      "|---|---|---|---|"]
            for c in e["claims"].values():
                measured = ", ".join(f"{k} {fmt_value(f['value'])} {f['unit']}".rstrip()
                                     for k, f in c.get("figures", {}).items())
                lines.append(f"| {c['name']} | {c['status']} | {_cell(measured)} | {_cell(c.get('note', ''))[:300]} |")
        if e["figures"]:
            lines += ["", f"## {Path(e['notebook']).name}: figures", "", "| figure | value | unit |", "|---|---|---|"]
            lines += [f"| {f['name']} | {fmt_value(f['value'])} | {f['unit']} |" for f in e["figures"].values()]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")


def failed_claims(entries: list[dict], statuses: tuple[str, ...] = (claims_mod.FAILED,)) -> list[tuple[str, dict]]:
    """(notebook file name, claim entry) of every claim whose verdict is in `statuses`, in run order."""
    return [(Path(e["notebook"]).name, c) for e in entries for c in (e.get("claims") or {}).values()
            if c.get("status") in statuses]


def reference_folder(machine: dict) -> str:
    """reference/<folder>/ of a machine: 'nvidia-h200', or 'nvidia-h200-x2' for a host of two (another machine)."""
    n = reference.gpu_count(machine)
    return machine_slug(machine["GPU"]) + (f"-x{n}" if n > 1 else "")


def save_plots(executed: dict, folder: Path) -> list[Path]:
    """Write each `plot:NAME`-tagged cell's last PNG output of an executed notebook to folder/NAME.png."""
    written = []
    for cell in executed.get("cells", []):
        tags = [t for t in cell.get("metadata", {}).get("tags", []) if t.startswith("plot:")]
        pngs = [o["data"]["image/png"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        if tags and pngs:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{tags[0][5:]}.png"
            path.write_bytes(base64.b64decode(pngs[-1]))
            written.append(path)
    return written


def _require_gpu(machine: dict) -> None:
    if machine.get("GPU", "none") in ("none", None):
        raise SystemExit("labkit run --reference: a reference run must be made on a GPU host (no GPU here)")


def save_reference(out_dir: Path, entries: list[dict], root: Path | None = None) -> Path:
    """Add a finished batch (summary entries and tagged plots) to reference/<machine>/ for students without one:
    the notebooks of this batch replace their earlier entries and plots, every other notebook's are kept."""
    summary = json.loads((out_dir / "summary.json").read_text())
    machine = summary.get("machine", {})
    _require_gpu(machine)
    dest = (root or reference.ROOT) / reference_folder(machine)
    dest.mkdir(parents=True, exist_ok=True)
    for e in entries:
        out = Path(e["output"])
        if out.exists():
            shutil.rmtree(dest / out.stem, ignore_errors=True)
            save_plots(nbio.read(out), dest / out.stem)
    new = summary["notebooks"]
    for e in new:  # paths on the GPU host mean nothing to a student
        e["notebook"], e["output"] = Path(e["notebook"]).name, Path(e["output"]).name
        e.setdefault("finished", summary.get("finished"))
        for key in ("commit", "dirty"):  # each notebook keeps the commit it ran from, as batches are merged
            e.setdefault(key, summary.get(key))
    old = json.loads((dest / "summary.json").read_text()) if (dest / "summary.json").exists() else {}
    names = {e["notebook"] for e in new}
    kept = [e for e in old.get("notebooks", []) if e["notebook"] not in names]
    summary["notebooks"] = sorted(kept + new, key=lambda e: e["notebook"])
    if "about" in old:
        summary["about"] = old["about"]
    (dest / "summary.json").write_text(json.dumps(summary, indent=1))
    from labkit.tools.reference import write_pending

    write_pending(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labkit run", description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: all of notebooks/)")
    ap.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="a parameter for every notebook, e.g. -p quick true -p device cuda")
    ap.add_argument("-o", "--output", type=Path, default=Path("build"), help="build folder (default: build/)")
    ap.add_argument("--timeout", type=float, default=3600,
                    help="seconds allowed per cell (default 3600, as course.py test's full-size runs): a cell that "
                         "hangs fails its notebook, named, and the batch goes on")
    ap.add_argument("--full-on-cpu", action="store_true",
                    help="run full problem sizes without a GPU anyway (many minutes per notebook)")
    ap.add_argument("--reference", action="store_true",
                    help="also save the summary and tagged plots into reference/<GPU>/ (a GPU host's full-size run)")
    ap.add_argument("--shard", metavar="K/N", help="run only shard K of N: notebooks dealt longest first by "
                    "their recorded GPU durations (see `labkit shard`)")
    ap.add_argument("--durations", type=Path, help="durations file for --shard (default: this GPU's in .ci/durations/)")
    ap.add_argument("--allow-failed-claims", action="store_true",
                    help="exit 0 even when a claim failed (for exploring); failed notebooks still fail the run")
    args = ap.parse_args(argv)

    notebooks = args.notebooks or course_notebooks()
    missing = [str(p) for p in notebooks if not p.is_file()]
    if missing:
        ap.error(f"no such notebook: {', '.join(missing)}")
    if args.shard:
        try:
            source = args.durations or shard.durations_file()
            notebooks = shard.select(notebooks, args.shard, shard.load_durations(source))
        except ValueError as exc:
            ap.error(str(exc))
        print(f"shard {args.shard} (durations from {source or 'nowhere: equal weights'}): "
              f"{' '.join(p.name for p in notebooks) or 'no notebooks'}")
    parameters = {name: parse_value(value) for name, value in args.parameter}
    taken = {p.name for p in notebooks}
    if len(taken) < len(notebooks):
        ap.error("two notebooks share a file name; they would overwrite each other in the build folder")
    try:
        shares = check_parameters(parameters, notebooks)
        full_on_cpu = _wants_full_size_on_cpu(parameters)
    except ValueError as exc:
        ap.error(str(exc))
    if full_on_cpu and not args.full_on_cpu:
        ap.error("full size without a GPU (quick false on the CPU): the notebooks' sizes are made for a GPU and "
                 "the Triton interpreter would take many minutes per cell. Leave quick unset (quick mode), or pass "
                 "--full-on-cpu to run it anyway.")
    args.output.mkdir(parents=True, exist_ok=True)

    if args.reference:  # refused before anything runs, not after the batch
        _require_gpu(run_facts(parameters).get("machine", {}))
    from tqdm.auto import tqdm

    entries: list[dict] = []

    def summarize() -> None:
        write_summary(entries, args.output, parameters, {**run_facts(parameters), "shard": args.shard})

    saved = None
    bar = tqdm(notebooks, desc="notebooks", unit="nb")
    for path in bar:
        bar.set_postfix_str(path.name)
        entry = run_one(path, args.output, shares[path], args.timeout)
        entries.append(entry)
        tqdm.write(f"{entry['status']:>6}  {path.name}  {entry['duration_s']:.1f} s"
                   + (f"  {entry['error'][:200]}" if entry["error"] else ""))
        if args.reference:  # saved after each notebook: a batch stopped by a time limit keeps what finished
            summarize()
            saved = save_reference(args.output, [entry])
    if saved is None:  # a reference batch wrote its summary with its last notebook
        summarize()
    failed = sum(e["status"] != "ok" for e in entries)
    k = claims_mod.tally({f"{i}:{n}": c for i, e in enumerate(entries) for n, c in e["claims"].items()})
    print(f"{len(entries) - failed} ok, {failed} failed; claims: {k['held']} held, {k['differs']} differ (diagnosed), "
          f"{k['failed']} failed, {k['inconclusive']} inconclusive, {k['skipped']} skipped; "
          f"summary in {args.output / 'summary.md'}")
    for nb, c in failed_claims(entries):
        print(f"FAILED CLAIM  {nb}: {c['name']}: expected {c.get('expected')}; {c.get('note', '')}"[:400])
    if saved is not None:
        print(f"reference run saved in {saved}")
    if k["failed"] and not args.allow_failed_claims:
        print(f"{k['failed']} claim(s) failed: the run fails (--allow-failed-claims to explore without failing)")
        return 1
    return 1 if failed else 0
