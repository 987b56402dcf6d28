"""labkit.profiling.ncu_report: the ncu CSV parser and kernel table on committed reports."""
from pathlib import Path

import pytest

from labkit.profiling import ncu_report as R

DATA = Path(__file__).resolve().parent / "data"
# Format fixtures: hand-written to follow ncu's documented CSV layouts; plausible, not measured numbers.
RAW_FIXTURE = DATA / "ncu_raw_format_fixture.csv"
DETAILS_FIXTURE = DATA / "ncu_details_format_fixture.csv"


def test_raw_page_fixture_parses_into_the_table():
    launches = R.parse_ncu_csv(RAW_FIXTURE.read_text())
    assert len(launches) == 2
    add, mm = launches
    assert "vectorized_elementwise_kernel" in add.kernel and add.block == "(128, 1, 1)"
    assert add.metrics["gpu__time_duration.sum"] == (189.73, "usecond")
    rows = R.kernel_table(launches, flops={"xmma": 2.0 * 4096**3})
    a, m = rows
    assert a["duration_us"] == pytest.approx(189.73)
    assert a["dram_bytes"] == pytest.approx(536.88e6 + 268.44e6)
    assert a["dram_gbps"] == pytest.approx((536.88e6 + 268.44e6) / 189.73e-6 / 1e9)
    assert a["flops"] == pytest.approx(67_108_864)             # the fadd counter, thousands separators read
    assert a["intensity"] == pytest.approx(67_108_864 / (536.88e6 + 268.44e6))
    assert a["occupancy_pct"] == pytest.approx(81.07) and a["memory_pct"] == pytest.approx(88.41)
    assert m["flops"] == pytest.approx(2.0 * 4096**3)           # the model's count replaces the SASS counters
    assert m["tflops"] == pytest.approx(2.0 * 4096**3 / 214.05e-6 / 1e12)
    assert m["intensity"] > 100 > a["intensity"]
    text = R.format_table(rows)
    assert "DRAM GB/s" in text and len(text.splitlines()) == 3


def test_details_page_fixture_picks_the_percent_rows():
    (k,) = R.parse_ncu_csv(DETAILS_FIXTURE.read_text())
    assert k.get("memory_pct") == pytest.approx(88.41)      # not the Tbyte/second row of the same name
    assert k.get("duration_us") == pytest.approx(189.73)
    assert k.get("occupancy_pct") == pytest.approx(81.07)
    assert k.get("theoretical_occupancy_pct") == pytest.approx(100)
    assert k.get("dram_bytes") is None


def test_parser_skips_profiler_chatter_and_quotes_ncu_errors():
    text = "==PROF== Connected to process 1 (python)\nhello from the program\n" + RAW_FIXTURE.read_text() + \
           "==PROF== Disconnected from process 1\n"
    assert len(R.parse_ncu_csv(text)) == 2
    denied = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
    with pytest.raises(ValueError, match="ERR_NVGPUCTRPERM"):
        R.parse_ncu_csv(denied)
    with pytest.raises(ValueError, match="run ncu with --csv"):
        R.parse_ncu_csv("just some program output\n")


@pytest.mark.parametrize("path", sorted(DATA.glob("ncu_*.csv")), ids=lambda p: p.name)
def test_every_committed_ncu_report_parses(path):
    """Fixtures and any real report (tests/data/ncu_*.csv): every launch has a name and a duration."""
    rows = R.kernel_table(R.parse_ncu_csv(path.read_text()))
    assert rows and all(r["kernel"] and r["duration_us"] and r["duration_us"] > 0 for r in rows)
    for r in rows:
        for c in ("memory_pct", "sm_pct", "occupancy_pct"):
            assert r[c] is None or 0 <= r[c] <= 100.5
