import base64
import json

from labkit import reference
from labkit.tools.run import save_plots

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")


def make_run(root, notebook="04_bottlenecks"):
    run = root / "nvidia-h200"
    (run / notebook).mkdir(parents=True)
    (run / notebook / "matmul_rate.png").write_bytes(PNG)
    summary = {"machine": {"GPU": "NVIDIA H200", "torch": "2.11.0"}, "finished": "2026-11-22T12:00:00+00:00",
               "notebooks": [{"notebook": f"{notebook}.ipynb", "figures": {
                   "add_gbps": {"name": "add_gbps", "value": 4242.0, "unit": "GB/s"}},
                   "claims": {"memory_bound": {"name": "memory_bound", "status": "held"}}}]}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_show_prints_another_machines_figures_labelled_as_such(tmp_path, capsys):
    make_run(tmp_path)
    assert reference.show("04_bottlenecks", plots=["matmul_rate", "missing"], root=tmp_path)
    out = capsys.readouterr().out
    assert "Reference run on another machine (NVIDIA H200, torch 2.11.0, run 2026-11-22)" in out
    assert "add_gbps = 4,242 GB/s" in out and "claim memory_bound: held" in out
    assert "matmul_rate.png" in out and "no plot 'missing'" in out


def test_show_says_so_when_no_reference_run_has_the_notebook(tmp_path, capsys):
    make_run(tmp_path)
    assert not reference.show("09_attention", root=tmp_path)
    assert "No reference run" in capsys.readouterr().out


def test_tagged_plots_are_saved_from_an_executed_notebook(tmp_path):
    png64 = base64.b64encode(PNG).decode()
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["plot:roofline"]},
                     "outputs": [{"output_type": "display_data", "data": {"image/png": png64}}]},
                    {"cell_type": "code", "metadata": {}, "outputs": [{"output_type": "display_data",
                                                                       "data": {"image/png": png64}}]}]}
    written = save_plots(nb, tmp_path / "nb")
    assert [p.name for p in written] == ["roofline.png"] and written[0].read_bytes() == PNG


def test_a_reference_batch_is_added_to_its_machine_and_keeps_the_other_notebooks(tmp_path):
    from labkit.tools.run import save_reference

    make_run(tmp_path)  # 04's entry and plot, from an earlier batch
    png64 = base64.b64encode(PNG).decode()
    nb = {"cells": [{"cell_type": "code", "id": "c1", "metadata": {"tags": ["plot:bubble"]}, "source": "",
                     "execution_count": 1,
                     "outputs": [{"output_type": "display_data", "data": {"image/png": png64}}]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}

    def batch(name: str, gpus: str) -> None:
        out = tmp_path / f"build-{gpus}"
        out.mkdir()
        (out / f"{name}.ipynb").write_text(json.dumps(nb))
        summary = {"machine": {"GPU": "NVIDIA H200", "GPUs": gpus, "torch": "2.11.0"},
                   "finished": "2026-11-23T10:00:00+00:00",
                   "notebooks": [{"notebook": f"/host/notebooks/{name}.ipynb", "output": str(out / f"{name}.ipynb"),
                                  "figures": {}, "claims": {}}]}
        (out / "summary.json").write_text(json.dumps(summary))
        save_reference(out, summary["notebooks"], root=tmp_path)

    batch("10_model_parallel", "1")
    one = json.loads((tmp_path / "nvidia-h200" / "summary.json").read_text())
    assert [e["notebook"] for e in one["notebooks"]] == ["04_bottlenecks.ipynb", "10_model_parallel.ipynb"]
    assert (tmp_path / "nvidia-h200" / "04_bottlenecks" / "matmul_rate.png").is_file()
    assert (tmp_path / "nvidia-h200" / "10_model_parallel" / "bubble.png").is_file()
    assert one["notebooks"][1]["output"] == "10_model_parallel.ipynb"  # no host paths
    batch("10_model_parallel", "2")  # a 2-GPU host: a machine of its own, the 1-GPU run untouched
    two = json.loads((tmp_path / "nvidia-h200-x2" / "summary.json").read_text())
    assert [e["notebook"] for e in two["notebooks"]] == ["10_model_parallel.ipynb"]
    assert json.loads((tmp_path / "nvidia-h200" / "summary.json").read_text()) == one
    assert reference.machine_label(two).startswith("2 x NVIDIA H200, torch 2.11.0")


def test_each_notebook_is_read_from_a_one_gpu_run_before_a_multi_gpu_run_that_holds_only_it(tmp_path):
    def run(folder: str, gpus: str, notebooks: list[str], finished: str) -> None:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "summary.json").write_text(json.dumps({
            "machine": {"GPU": "NVIDIA H100 80GB HBM3", "GPUs": gpus}, "finished": finished,
            "notebooks": [{"notebook": f"{n}.ipynb", "duration_s": float(len(n))} for n in notebooks]}))

    run("nvidia-h100-80gb-hbm3", "1", ["00_why_gpus", "10_model_parallel"], "2026-11-25")
    run("nvidia-h100-80gb-hbm3-x2", "2", ["10_model_parallel"], "2026-11-26")
    run("nvidia-h200", "1", ["00_why_gpus", "13_capstone"], "2026-11-20")
    found = reference.by_notebook(tmp_path)
    assert set(found) == {"00_why_gpus", "10_model_parallel", "13_capstone"}
    assert found["10_model_parallel"][1]["machine"]["GPUs"] == "1"  # one GPU before two, though older
    assert found["00_why_gpus"][1]["finished"] == "2026-11-25"  # the newer of two one-GPU runs


# --- claim names: the notebooks' against the committed reference runs -------------------------------------------
import pytest  # noqa: E402

from labkit import claimnames  # noqa: E402
from labkit.paths import NOTEBOOKS_DIR  # noqa: E402
from labkit.tools import reference as reference_tool  # noqa: E402


def write_nb(path, *cells: str):
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []}
                                          for c in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_claim_names_are_read_from_literals_loops_fstrings_and_branches(tmp_path):
    nb = write_nb(tmp_path / "04_x.ipynb",
                  'labkit.claim("plain", "e", True)\nlabkit.skip_claim("a" if cfg.is_gpu else "b", "e", needs="x")',
                  'for name, says in (("loop_one", "e"), ("loop_two", "e")):\n'
                  '    labkit.skip_claim(name, says, needs="x")',
                  'for s in sizes:\n    labkit.claim(f"rate_at_{s}", "e", True)\n%timeit x')
    names = claimnames.in_notebook(nb)
    assert [n.text for n in names] == ["plain", "a", "b", "loop_one", "loop_two", "rate_at_{s}"]
    fs = names[-1]
    assert fs.matches("rate_at_4096") and not fs.matches("rate_at_4096_extra_x y") and not fs.matches("plain")


def test_a_claim_name_computed_at_run_time_is_refused_with_what_to_write(tmp_path):
    nb = write_nb(tmp_path / "05_x.ipynb", 'for name in make_names():\n    labkit.claim(name, "e", True)')
    with pytest.raises(claimnames.UnreadableClaimName, match="05_x.ipynb, code cell 1.*for name in"):
        claimnames.in_notebook(nb)


def fake_course(tmp_path, recorded: dict, not_made: list[str] = ()):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    write_nb(nbs / "04_x.ipynb", 'labkit.claim("old", "e", True)\nlabkit.claim("new_one", "e", True)',
             'labkit.claim(f"size_{n}", "e", True)\nlabkit.claim("cpu_only", "e", True)')
    write_nb(nbs / "05_y.ipynb", 'labkit.claim("z", "e", True)')
    run = tmp_path / "ref" / "nvidia-h200"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"machine": {"GPU": "NVIDIA H200"}, "notebooks": [
        {"notebook": "04_x.ipynb", "claims": {k: {"name": k, "status": v} for k, v in recorded.items()},
         "not_made_here": list(not_made)}]}))
    return nbs, run


def test_pending_lists_new_claims_and_is_idempotent(tmp_path, capsys):
    nbs, run = fake_course(tmp_path, {"old": "held", "size_1024": "held"}, ["cpu_only"])
    args = ["reference", "pending", "--root", str(run.parent), "--notebooks", str(nbs)]
    from labkit import cli

    assert cli.main(args + ["--check"]) == 1  # no pending.json yet
    assert cli.main(args) == 0
    first = (run / "pending.json").read_text()
    assert json.loads(first)["claims"] == {"04_x": ["new_one"]}  # cpu_only: run here, not made here
    assert json.loads(first)["notebooks_not_run"] == ["05_y"]
    assert cli.main(args) == 0 and (run / "pending.json").read_text() == first
    assert cli.main(args + ["--check"]) == 0 and "(unchanged)" in capsys.readouterr().out
    assert reference.show("04_x", root=run.parent)
    out = capsys.readouterr().out
    assert "claim new_one: not yet verified here" in out and "claim old: held" in out


def test_a_recorded_claim_the_notebook_no_longer_makes_fails_or_is_withdrawn(tmp_path, capsys):
    nbs, run = fake_course(tmp_path, {"old": "held", "gone": "failed"})
    args = ["reference", "pending", "--root", str(run.parent), "--notebooks", str(nbs)]
    from labkit import cli

    assert cli.main(args) == 1 and "04_x: gone" in capsys.readouterr().out
    assert not (run / "pending.json").exists()
    assert cli.main(args + ["--drop-stale"]) == 0
    entry = reference.load(run)["notebooks"][0]
    assert entry["withdrawn"] == ["gone"] and list(entry["claims"]) == ["old"]
    assert entry["claim_counts"]["failed"] == 0
    assert cli.main(args) == 0  # nothing stale left


@pytest.mark.parametrize("run", reference.runs(), ids=lambda p: p.name)
def test_each_committed_reference_makes_the_notebooks_claims_or_lists_them_pending(run):
    stale = reference_tool.stale_claims(run)
    assert not stale, (f"{run.name} holds claims the notebooks no longer make: {stale}; rerun them there, or "
                       f"`labkit reference pending {run.name} --drop-stale`")
    assert reference.pending(run) == reference.pending_now(run), (
        f"{run.name}/pending.json is out of date: run `labkit reference pending {run.name}` and commit it")


def test_every_notebooks_claim_names_can_be_read():
    for nb in sorted(NOTEBOOKS_DIR.glob("[0-9]*.ipynb")):
        assert claimnames.in_notebook(nb), f"{nb.name}: no claims read"
