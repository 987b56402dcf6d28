"""What a new student meets first: time estimates per notebook as data, and README's troubleshooting."""
import json
import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))


def test_every_notebook_has_a_cpu_and_a_gpu_time_with_its_machine():
    times = json.loads((ROOT / "notebooks" / "durations.json").read_text())
    for column in ("cpu_quick", "gpu_full"):
        assert times[column]["machine"] and times[column]["measured"]
        assert all(0 < s < 3600 for s in times[column]["seconds"].values())
    assert sorted(times["cpu_quick"]["seconds"]) == NOTEBOOKS  # every notebook runs here
    assert set(times["gpu_full"]["seconds"]) <= set(NOTEBOOKS) and len(times["gpu_full"]["seconds"]) >= 10
    assert "NVIDIA" in times["gpu_full"]["machine"]  # a GPU's full-size run (the committed reference)


def test_the_index_computes_the_time_table_from_the_data():
    index = nbformat.read(ROOT / "notebooks" / "index.ipynb", as_version=4)
    code = "\n".join(c.source for c in index.cells if c.cell_type == "code")
    assert "durations.json" in code and "reference.by_notebook()" in code
    prose = "\n".join(c.source for c in index.cells if c.cell_type == "markdown")
    assert not re.search(r"\d+\s*(s|min|seconds|minutes)\b", prose)  # no typed durations


def test_readme_has_troubleshooting_for_the_first_hour():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
    for topic in ("--allow-root", "token", "busy", "labkit info --refresh", "no GPU", "--full-on-cpu"):
        assert topic in section, topic
