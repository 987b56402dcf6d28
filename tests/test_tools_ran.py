"""labkit ran: a GPU batch run whose notebooks skipped their GPU work, ran too fast or lost their plots fails."""
import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from labkit import cli
from labkit.device import MACHINE_MIME, SKIP_MIME
from labkit.tools import ran

PNG = "iVBORw0KGgo="  # any base64 will do: the check looks for an image output, not at it


def machine(device: str) -> dict:
    """labkit.show_machine()'s output: the table for people, machine_info() as data."""
    return new_output("display_data", data={"text/plain": f"device              {device}\n",
                                            MACHINE_MIME: {"name": "machine", "device": device}})


def skipped(section: str, gpus: int, device: str, have: int) -> dict:
    """labkit.have_gpus(gpus, section)'s output on a machine without them: one line, and the skip as data."""
    need = "a CUDA GPU" if gpus == 1 else f"{gpus} CUDA GPUs"
    return new_output("display_data", data={
        "text/plain": f"[skipped on this machine] {section} needs {need}; running on {device} with {have}.",
        SKIP_MIME: {"name": section, "section": section, "needs_gpus": gpus, "device": device, "gpus": have}})


MACHINE_GPU, MACHINE_CPU = machine("cuda"), machine("cpu")


def cell(source: str, *outs: dict | str, image: bool = False, tags: tuple[str, ...] = ()) -> dict:
    outputs = [new_output("stream", name="stdout", text=o) if isinstance(o, str) else o for o in outs]
    if image:
        outputs.append(new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}))
    c = new_code_cell(source, outputs=outputs)
    c.metadata["tags"] = list(tags)
    return c


def good_cells() -> list[dict]:
    return [cell("labkit.show_machine()", MACHINE_GPU),
            cell("fig, ax = plt.subplots()\nax.plot(x, y)", image=True, tags=("plot:sweep",)),
            cell("if labkit.have_gpus(2, 'the two-GPU part'): ...", skipped("the two-GPU part", 2, "cuda", 1))]


def held(name: str = "fast") -> dict:
    return {"name": name, "status": "held", "note": ""}


def write_run(tmp_path: Path, cells: list[dict], claims: dict | None = None, duration: float = 20.0,
              gpu: str = "NVIDIA H200", gpus: str = "1", quick: bool = False) -> Path:
    nb_path = tmp_path / "run" / "04_bottlenecks.ipynb"
    nb_path.parent.mkdir(exist_ok=True)
    nbformat.write(new_notebook(cells=cells), nb_path)
    summary = {"quick": quick, "machine": {"GPU": gpu, "GPUs": gpus}, "notebooks": [
        {"notebook": "/repo/notebooks/04_bottlenecks.ipynb", "output": str(nb_path), "status": "ok", "error": None,
         "duration_s": duration, "claims": {"fast": held()} if claims is None else claims}]}
    path = tmp_path / "run" / "summary.json"
    path.write_text(json.dumps(summary))
    return path


@pytest.fixture
def durations(tmp_path):
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"machine": {"GPU": "NVIDIA H200"}, "seconds": {"04_bottlenecks.ipynb": 26.0}}))
    return path


def test_a_real_gpu_run_passes(tmp_path, durations, capsys):
    summary = write_run(tmp_path, good_cells())
    assert ran.check(summary, durations, expect_gpu=True) == []
    assert cli.main(["ran", str(summary), "--durations", str(durations), "--expect-gpu"]) == 0
    assert "really ran: 1 of 1 notebooks" in capsys.readouterr().out


@pytest.mark.parametrize("cells, claims, duration, why", [
    ([cell("labkit.show_machine()", MACHINE_CPU)] + good_cells()[1:], None, 20.0, "ran on the CPU on a GPU host"),
    (good_cells() + [cell("", skipped("the overlap experiment", 1, "cpu", 0))], None, 20.0,
     "skipped 'the overlap experiment'"),
    (good_cells(), {"a": {"name": "a", "status": "skipped", "note": "2 GPUs"},
                    "b": {"name": "b", "status": "skipped", "note": "a CUDA GPU"}}, 20.0, "all 2 claims were skipped"),
    (good_cells(), {"fast": held(), "cuda": {"name": "cuda", "status": "skipped", "note": "a CUDA GPU"}}, 20.0,
     "claim 'cuda' skipped although this host has what it needs"),
    (good_cells(), None, 3.1, "finished in 3.1 s, under 30% of the 26.0 s recorded"),
    ([good_cells()[0], cell("plt.plot(x, y)", tags=("plot:sweep",))], None, 20.0,
     "code cell 2 (plot:sweep) kept no plot: is MPLBACKEND=Agg set"),
    ([good_cells()[0], cell("fig, ax = plt.subplots()\nax.plot(x, y)")], None, 20.0,
     "it plots but the executed notebook holds no image"),
])
def test_what_did_not_really_run_fails(tmp_path, durations, capsys, cells, claims, duration, why):
    summary = write_run(tmp_path, cells, claims, duration)
    found = ran.check(summary, durations)
    assert any(why in f for f in found), found
    assert all(f.startswith("04_bottlenecks.ipynb: ") for f in found)
    assert cli.main(["ran", str(summary), "--durations", str(durations)]) == 1
    out = capsys.readouterr().out
    assert "NOT REALLY RUN  04_bottlenecks.ipynb: " in out and "really ran: 0 of 1 notebooks" in out


def test_what_the_host_lacks_may_be_skipped_but_not_what_it_has(tmp_path, durations):
    ring = skipped("the ring", 2, "cuda", 2)
    two_gpus = good_cells() + [cell("", ring)]
    assert ran.check(write_run(tmp_path, good_cells(), gpus="1"), durations) == []
    found = ran.check(write_run(tmp_path, two_gpus, gpus="2"), durations)
    assert len(found) == 2 and all("needs 2 GPU(s); this host has 2" in f for f in found)
    excused = [good_cells()[0], cell("if labkit.have_gpus(2, 'ddp'): plot()", skipped("ddp", 2, "cuda", 1),
                                     tags=("plot:ddp",))]
    assert ran.check(write_run(tmp_path, excused), durations) == []


def test_a_cpu_run_is_only_held_to_its_plots_unless_a_gpu_is_expected(tmp_path, durations):
    cpu_cells = [cell("labkit.show_machine()", MACHINE_CPU),
                 cell("", skipped("x", 1, "cpu", 0)),
                 cell("plt.plot(x)", image=True, tags=("plot:x",))]
    summary = write_run(tmp_path, cpu_cells, duration=0.5, gpu="none", gpus="0", quick=True)
    assert ran.check(summary, durations) == []
    assert any("the run saw no GPU" in f for f in ran.check(summary, durations, expect_gpu=True))


def test_quick_mode_on_a_gpu_host_fails_unless_allowed(tmp_path, durations):
    summary = write_run(tmp_path, good_cells(), duration=1.0, quick=True)
    assert any("ran in quick mode on a GPU host" in f for f in ran.check(summary, durations))
    assert ran.check(summary, durations, allow_quick=True) == []  # and no duration check in quick mode


def test_executed_notebooks_are_found_next_to_a_moved_summary(tmp_path, durations):
    write_run(tmp_path, good_cells())
    moved = tmp_path / "artifact"
    (tmp_path / "run").rename(moved)
    assert ran.check(moved / "summary.json", durations) == []
    (moved / "04_bottlenecks.ipynb").unlink()
    assert any("is missing" in f for f in ran.check(moved / "summary.json", durations))


def test_a_skip_is_read_as_data_not_from_the_printed_line(tmp_path, durations):
    """The printed line alone (as an old run or a hand-written print would leave) is for people, not the check."""
    line = cell("", "[skipped on this machine] the overlap experiment needs a CUDA GPU; running on cpu with 0.\n")
    assert ran.check(write_run(tmp_path, good_cells() + [line]), durations) == []
    found = ran.check(write_run(tmp_path, good_cells() + [cell("", skipped("overlap", 1, "cpu", 0))]), durations)
    assert any("skipped 'overlap'" in f for f in found)
