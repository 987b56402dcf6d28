"""labkit shard: notebooks split across GPUs/runners longest first, deterministically, from recorded durations."""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.paths import child_env, machine_slug
from labkit.tools import shard

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / ".ci" / "durations" / "nvidia-h200.json"


def test_longest_first_to_the_least_loaded_shard():
    durations = {"a": 10.0, "b": 9.0, "c": 8.0, "d": 1.0}
    assert shard.plan(["a", "b", "c", "d"], 2, durations) == [["a", "d"], ["b", "c"]]
    assert shard.plan(["d", "c", "b", "a"], 2, durations) == [["d", "a"], ["c", "b"]]  # course order kept in a shard


def test_the_split_is_deterministic_complete_and_balanced():
    durations = shard.load_durations(H200)
    names = sorted(durations)
    for n in (1, 2, 3, 4, len(names) + 2):
        shards = shard.plan(names, n, durations)
        assert shards == shard.plan(names, n, dict(reversed(list(durations.items()))))
        assert sorted(x for s in shards for x in s) == names and len(shards) == n
        loads = [sum(durations[x] for x in s) for s in shards]
        assert max(loads) - min(loads) <= max(durations.values())
    assert [set(s) for s in shard.plan(names, 2, durations)] == \
        [set(s) for s in shard.plan(list(reversed(names)), 2, durations)]  # the input order does not matter


def test_a_notebook_without_a_recorded_duration_counts_as_the_median():
    assert shard.plan(["new", "a", "b", "c"], 2, {"a": 1.0, "b": 5.0, "c": 9.0}) == [["a", "c"], ["new", "b"]]
    assert shard.plan(["x", "y", "z"], 2, {}) == [["x", "z"], ["y"]]  # no data: equal weights, by name


@pytest.mark.parametrize("bad", ["0/2", "3/2", "1/0", "a/b", "", "2"])
def test_a_bad_shard_says_how_to_write_it(bad):
    with pytest.raises(ValueError, match="K/N"):
        shard.parse_shard(bad)


def test_select_gives_each_notebook_to_exactly_one_shard():
    paths = [ROOT / "notebooks" / n for n in sorted(shard.load_durations(H200))]
    picked = [p for k in (1, 2, 3) for p in shard.select(paths, f"{k}/3", shard.load_durations(H200))]
    assert sorted(picked) == sorted(paths)


def test_the_recorded_h200_durations_name_their_machine_and_real_notebooks():
    data = json.loads(H200.read_text())
    assert data["machine"]["GPU"] == "NVIDIA H200" and data["machine"]["torch"] and data["source"]
    assert machine_slug(data["machine"]["GPU"]) == H200.stem
    assert all(v > 0 for v in data["seconds"].values()) and len(data["seconds"]) >= 9
    assert all((ROOT / "notebooks" / name).is_file() for name in data["seconds"])


def summary(tmp_path: Path, quick: bool = False, gpu: str = "NVIDIA H200") -> Path:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"quick": quick, "machine": {"GPU": gpu, "GPUs": "1", "torch": "2.11"}, "notebooks": [
        {"notebook": "/h/notebooks/00_a.ipynb", "status": "ok", "duration_s": 12.345},
        {"notebook": "/h/notebooks/01_b.ipynb", "status": "failed", "duration_s": 1.0}]}))
    return path


def test_record_stores_a_full_size_gpu_run_and_refuses_others(tmp_path):
    out = shard.record([summary(tmp_path)], tmp_path / "d.json")
    data = json.loads(out.read_text())
    assert data["seconds"] == {"00_a.ipynb": 12.3} and data["machine"]["GPU"] == "NVIDIA H200"
    assert shard.load_durations(out) == {"00_a.ipynb": 12.3}
    with pytest.raises(SystemExit, match="not a full-size GPU run"):
        shard.record([summary(tmp_path, quick=True)], tmp_path / "q.json")
    with pytest.raises(SystemExit, match="not a full-size GPU run"):
        shard.record([summary(tmp_path, gpu="none")], tmp_path / "c.json")


def test_labkit_run_shard_runs_only_its_notebooks(tmp_path):
    for name in ("a.ipynb", "b.ipynb", "c.ipynb"):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"print('{name}')")])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / name)
    durations = tmp_path / "durations.json"
    seconds = {"a.ipynb": 50, "b.ipynb": 30, "c.ipynb": 25}
    durations.write_text(json.dumps({"machine": {"GPU": "x"}, "seconds": seconds}))
    env = child_env(ROOT)
    cmd = [sys.executable, "-m", "labkit.cli", "run", "-o", str(tmp_path / "out"), "--shard", "2/2",
           "--durations", str(durations), *(str(tmp_path / n) for n in ("a.ipynb", "b.ipynb", "c.ipynb"))]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [Path(e["notebook"]).name for e in result["notebooks"]] == ["b.ipynb", "c.ipynb"]
    assert result["shard"] == "2/2" and "shard 2/2" in done.stdout
    bad = subprocess.run(cmd[:6] + ["--shard", "3/2"] + cmd[8:], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "K/N" in bad.stderr
