"""labkit baseline: the compare flags slow kernels, fails on a geometric-mean drop, and ignores noise and CPU runs."""
import json
from pathlib import Path

import pytest

from labkit import cli
from labkit.tools import baseline

GPU = "Imaginary GPU 9000"  # no baseline is ever committed for it
CASES = [f"case{i}" for i in range(10)]


def bench_file(path: Path, ms: dict[str, float], spread: float | dict = 0.01, gpu: str = GPU) -> Path:
    """A `labkit bench --save` JSON with one row per case."""
    spreads = spread if isinstance(spread, dict) else {k: spread for k in ms}
    rows = [{"kernel": k, "shape": "64x64", "dtype": "fp32", "ms": v, "spread": spreads[k], "rate": 1.0,
             "unit": "GB/s", "ceiling": None, "fraction": None, "baseline_ms": {}, "speedup": {}}
            for k, v in ms.items()]
    path.write_text(json.dumps({"machine": {"GPU": gpu, "torch": "2.x"}, "rows": rows}))
    return path


def run(capsys, *args) -> tuple[int, str]:
    rc = cli.main(["baseline", "compare", *map(str, args)])
    return rc, capsys.readouterr().out


@pytest.fixture
def base(tmp_path):
    return bench_file(tmp_path / "base.json", {k: 1.0 + i / 10 for i, k in enumerate(CASES)})


def slower(base_path: Path, path: Path, factor: dict[str, float], spread: float | dict = 0.01) -> Path:
    rows = json.loads(base_path.read_text())["rows"]
    return bench_file(path, {r["kernel"]: r["ms"] * factor.get(r["kernel"], 1.0) for r in rows}, spread)


def test_the_same_run_passes(base, capsys):
    rc, out = run(capsys, base, base)
    assert rc == 0 and "geometric mean of speed-ups 1.000x over 10 cases" in out and "compare: ok" in out


def test_one_kernel_20_percent_slower_is_flagged_but_the_geomean_holds(base, tmp_path, capsys):
    new = slower(base, tmp_path / "new.json", {"case3": 1.2})
    rc, out = run(capsys, base, new)
    assert rc == 0 and "1 flagged" in out and "case3 64x64 fp32" in out.split("slower than the baseline")[1]
    assert "SLOWER" in next(line for line in out.splitlines() if line.startswith("case3 "))
    assert cli.main(["baseline", "compare", "--strict", str(base), str(new)]) == 1  # --strict fails on it


def test_every_kernel_3_percent_slower_fails_on_the_geomean(base, tmp_path, capsys):
    new = slower(base, tmp_path / "new.json", {k: 1.03 for k in CASES})
    rc, out = run(capsys, base, new)
    assert rc == 1 and "0 flagged" in out and "compare: FAILED" in out
    r = baseline.compare(baseline.load(base), baseline.load(new))
    assert r.geomean == pytest.approx(1 / 1.03) and r.failed and not r.flagged


def test_differences_inside_the_combined_spread_are_not_counted(tmp_path, capsys):
    ms = {k: 1.0 + i / 10 for i, k in enumerate(CASES)}
    noisy = bench_file(tmp_path / "noisy.json", ms, spread=0.4)
    rc, out = run(capsys, noisy, slower(noisy, tmp_path / "new.json", {"case1": 1.3}, spread=0.4))
    assert rc == 0 and "0 flagged" in out
    assert "within noise" in next(line for line in out.splitlines() if line.startswith("case1 "))
    # a uniform 3% drop is noise too when every case is spread over 50%
    loud = bench_file(tmp_path / "loud.json", ms, spread=0.5)
    r = baseline.compare(baseline.load(loud), baseline.load(slower(loud, tmp_path / "drop.json",
                                                                   {k: 1.03 for k in CASES}, spread=0.5)))
    assert r.geomean < 0.98 and r.geomean_noise > 0.2 and not r.failed


def test_a_cpu_run_is_never_compared(base, tmp_path, capsys):
    cpu = bench_file(tmp_path / "cpu.json", {k: 100.0 for k in CASES}, gpu="none")
    rc, out = run(capsys, base, cpu)
    assert rc == 0 and "ran without a GPU" in out and "not compared" in out


def test_no_baseline_for_this_device_is_said_plainly(base, tmp_path, capsys):
    rc, out = run(capsys, base)  # only NEW: the baseline would be .ci/baselines/imaginary-gpu-9000.json
    assert rc == 0 and "no baseline for this device (Imaginary GPU 9000)" in out
    assert ".ci/baselines/imaginary-gpu-9000.json" in out and "labkit baseline save" in out
    assert cli.main(["baseline", "compare", "--require", str(base)]) == 2
    other = bench_file(tmp_path / "other.json", {k: 1.0 for k in CASES}, gpu="Another GPU")
    rc, out = run(capsys, other, base)
    assert rc == 0 and "no baseline for this device" in out and "measured on Another GPU" in out


def test_missing_and_new_cases_are_listed_and_nothing_in_common_fails(base, tmp_path, capsys):
    rows = {r["kernel"]: r["ms"] for r in json.loads(base.read_text())["rows"]}
    rows.pop("case0")
    rows["brand_new"] = 1.0
    rc, out = run(capsys, base, bench_file(tmp_path / "new.json", rows))
    assert rc == 0 and "not in the new run (1): case0 64x64 fp32" in out and "not in the baseline (1): brand_new" in out
    rc, out = run(capsys, base, bench_file(tmp_path / "none.json", {"other": 1.0}))
    assert rc == 1 and "no kernel case in common" in out


def test_save_makes_a_baseline_with_figures_that_loads_and_compares(base, tmp_path, capsys):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"quick": False, "notebooks": [
        {"notebook": "/x/notebooks/04_bottlenecks.ipynb", "status": "ok",
         "figures": {"copy_gbps": {"name": "copy_gbps", "value": 4000.0, "unit": "GB/s"}}}]}))
    out = tmp_path / "baselines" / "mine.json"
    assert cli.main(["baseline", "save", str(base), "--summary", str(summary), "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["format"] == baseline.FORMAT and data["machine"]["GPU"] == GPU and len(data["bench"]) == 10
    assert data["figures"] == {"04_bottlenecks": {"copy_gbps": {"value": 4000.0, "unit": "GB/s"}}}
    loaded = baseline.load(out)
    assert loaded["bench"]["case2 64x64 fp32"] == {"ms": 1.2, "spread": 0.01, "unit": "GB/s"}
    capsys.readouterr()
    moved = json.loads(summary.read_text())
    moved["notebooks"][0]["figures"]["copy_gbps"]["value"] = 3000.0
    (tmp_path / "moved.json").write_text(json.dumps(moved))
    rc, text = run(capsys, out, base, "--summary", tmp_path / "moved.json")
    assert rc == 0 and "figure moved  04_bottlenecks copy_gbps: 4000 -> 3000 GB/s (-25%)" in text


def test_save_refuses_cpu_and_quick_runs(tmp_path):
    cpu = bench_file(tmp_path / "cpu.json", {"a": 1.0}, gpu="none")
    with pytest.raises(SystemExit, match="without a GPU"):
        baseline.make(cpu)
    quick = tmp_path / "quick.json"
    quick.write_text(json.dumps({"quick": True, "notebooks": []}))
    with pytest.raises(SystemExit, match="quick-mode"):
        baseline.make(bench_file(tmp_path / "gpu.json", {"a": 1.0}), [quick])


def test_a_file_that_is_not_a_bench_run_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": "nope"}))
    with pytest.raises(ValueError, match="not a baseline or `labkit bench --save` JSON"):
        baseline.load(bad)


def test_no_baseline_is_committed_without_a_real_gpu_run():
    for path in baseline.BASELINES.glob("*.json"):
        data = json.loads(path.read_text())
        assert data["format"] == baseline.FORMAT and data["machine"]["GPU"] not in ("", "none")
        assert path == baseline.path_for(data["machine"]["GPU"])
