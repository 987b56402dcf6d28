"""labkit.profiling.nsight: the ncu command line, why ncu made no report, and missing tools said in one line."""
from labkit.profiling import nsight as N


def test_ncu_command_has_the_flags_that_matter():
    cmd = N.ncu_command(["python", "w.py"], "rep", nvtx_ranges=["ncu_add"], launch_skip=3, launch_count=1,
                        kernel_regex="elementwise")
    s = " ".join(cmd)
    assert "--clock-control none" in s and "--nvtx --nvtx-include ncu_add/" in s
    assert "--kernel-name regex:elementwise" in s and "--launch-skip 3" in s and "--launch-count 1" in s
    assert cmd[-2:] == ["python", "w.py"] and "--metrics" in cmd
    basic = N.ncu_command(["python"], "rep", metrics=(), section_set="basic")
    assert "--metrics" not in basic and "--set basic" in " ".join(basic)


def test_ncu_problem_names_the_cause():
    denied = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
    assert "NVreg_RestrictProfilingToAdminUsers" in N.ncu_problem(denied)
    assert "matched nothing" in N.ncu_problem("==WARNING== No kernels were profiled.")
    assert N.ncu_problem("==ERROR== something else\nmore") == "==ERROR== something else"
    assert N.ncu_problem("==PROF== all fine") is None


def test_missing_tools_give_one_clear_message(monkeypatch, tmp_path):
    monkeypatch.setattr(N.shutil, "which", lambda name: None)
    launches, msg = N.run_ncu(N.ncu_command(["python"], tmp_path / "r"))
    assert launches == [] and "ncu is not installed" in msg
    text, msg = N.run_nsys(["python"], tmp_path / "r")
    assert text is None and "nsys is not installed" in msg
