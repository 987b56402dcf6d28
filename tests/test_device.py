import os
import sys
import warnings

import pytest
import torch

import labkit
from labkit import device


@pytest.fixture
def restore_setup(monkeypatch):
    saved = device._current
    yield monkeypatch
    device._current = saved


def test_auto_device_matches_torch(restore_setup):
    restore_setup.delenv("LABKIT_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.choose_device().type == expected


def test_argument_beats_environment(restore_setup):
    restore_setup.setenv("LABKIT_DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
    assert device.choose_device("cpu").type == "cpu"


def test_environment_picks_cpu(restore_setup):
    restore_setup.setenv("LABKIT_DEVICE", "cpu")
    cfg = labkit.setup()
    assert cfg.device.type == "cpu" and cfg.triton_interpreter
    assert os.environ["TRITON_INTERPRET"] == "1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_a_missing_gpu_says_what_to_do(restore_setup):
    with pytest.raises(RuntimeError, match="no CUDA GPU.*Leave device unset"):
        device.choose_device("cuda")


def test_unknown_device_is_refused():
    for name in ("mps:0", "gpu", "cuda0"):
        with pytest.raises(ValueError, match=f"device='{name}' is not a device name: use 'cuda', 'cuda:1' or 'cpu'"):
            device.choose_device(name)


@pytest.mark.parametrize("value,expected", [("1", True), ("0", False), ("", None), ("yes", True)])
def test_quick_flag_parsing(restore_setup, value, expected):
    restore_setup.setenv("LABKIT_QUICK", value)
    assert device._env_flag("LABKIT_QUICK") is expected


def test_bad_quick_flag_is_an_error(restore_setup):
    restore_setup.setenv("LABKIT_QUICK", "maybe")
    with pytest.raises(ValueError, match="use 1 or 0"):
        labkit.setup()


def test_quick_mode_and_sized(restore_setup):
    labkit.setup(quick=True)
    assert labkit.sized(full=1000, quick=10) == 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # full size on the CPU warns (tested below)
        labkit.setup(quick=False)
    assert labkit.sized(full=1000, quick=10) == 1000


def test_quick_is_default_without_gpu(restore_setup):
    restore_setup.delenv("LABKIT_QUICK", raising=False)
    cfg = labkit.setup(device="cpu")
    assert cfg.quick is True


def test_missing_gpus_print_one_line(restore_setup, capsys):
    labkit.setup(device="cpu")
    assert labkit.have_gpus(1, "the overlap experiment") is False
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "the overlap experiment" in out[0] and "needs a CUDA GPU" in out[0]


def test_a_skip_and_the_machine_are_data_beside_their_lines(restore_setup, monkeypatch):
    """`labkit ran` reads where a notebook ran and what it skipped from these entries, not from the printed text."""
    from labkit import device

    shown = []
    monkeypatch.setattr(device, "display_entry", lambda text, mime, entry: shown.append((text, mime, entry)))
    labkit.setup(device="cpu")
    assert labkit.have_gpus(2, "the ring") is False
    text, mime, entry = shown[-1]
    assert mime == device.SKIP_MIME and text.startswith("[skipped on this machine] the ring needs 2 CUDA GPUs")
    assert entry == {"name": "the ring", "section": "the ring", "needs_gpus": 2, "device": "cpu", "gpus": 0}
    info = labkit.show_machine()
    text, mime, entry = shown[-1]
    assert mime == device.MACHINE_MIME and entry["device"] == "cpu" and entry["torch"] == info["torch"]
    assert text.splitlines()[0].split() == ["device", "cpu"]


def test_machine_table_names_the_facts(capsys):
    info = labkit.show_machine()
    for key in ("device", "torch", "triton", "GPU", "CPU cores"):
        assert key in info
    assert info["torch"] == torch.__version__
    printed = capsys.readouterr().out
    assert all(k in printed for k in info)
    if torch.cuda.is_available():
        for key in ("SMs", "GPU memory", "L2 cache", "driver"):
            assert key in info


def test_importing_labkit_does_not_import_triton():
    import subprocess
    code = "import sys, labkit; sys.exit('triton' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_triton_kernels_with_runtime_loop_bounds_run_on_this_device():
    """A loop over a runtime length (old interpreters choked on it under NumPy 2)."""
    import triton
    import triton.language as tl

    @triton.jit
    def row_sum(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
        tl.store(out_ptr + row, tl.sum(acc, axis=0))

    dev = labkit.current().device
    x = torch.randn(3, 37, device=dev)
    out = torch.full((3,), float("nan"), device=dev)
    row_sum[(3,)](x, out, 37, BLOCK=16)
    torch.testing.assert_close(out.double().cpu(), x.double().sum(1).cpu(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("value,expected", [("False", False), ("false", False), ("0", False), (0, False),
                                            ("True", True), (" yes ", True), (1, True), ("None", None), (None, None)])
def test_quick_as_papermill_passes_it(restore_setup, value, expected):
    restore_setup.setenv("LABKIT_QUICK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = labkit.setup(device="cpu", quick=value)
    assert cfg.quick is (True if expected is None else expected)


@pytest.mark.parametrize("value", [[1], "maybe", 2, 0.5, {"a": 1}])
def test_malformed_quick_is_an_error_naming_it(restore_setup, value):
    with pytest.raises(ValueError, match=r"parameter quick=.*True or False"):
        labkit.setup(device="cpu", quick=value)


@pytest.mark.parametrize("value", [["cuda"], 0, 1.5])
def test_malformed_device_is_an_error_naming_it(restore_setup, value):
    with pytest.raises(ValueError, match=r"parameter device=.*'cuda'"):
        labkit.setup(device=value)


def test_device_none_string_means_automatic(restore_setup):
    restore_setup.delenv("LABKIT_DEVICE", raising=False)
    assert device.choose_device("None").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_full_size_on_the_cpu_warns_up_front(restore_setup):
    with pytest.warns(UserWarning, match="full problem sizes on the CPU"):
        labkit.setup(device="cpu", quick=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labkit.setup(device="cpu", quick=True)  # quick mode: no warning


def test_the_last_level_cache_is_the_largest_level_listed(tmp_path, monkeypatch):
    """A CPU's last-level cache: the largest size sysfs lists for CPU 0, whatever its units; None where none reads."""
    for i, size in enumerate(["48K", "1024K", "32768K\n", "junk"]):
        (tmp_path / "cpu0" / "cache" / f"index{i}").mkdir(parents=True)
        (tmp_path / "cpu0" / "cache" / f"index{i}" / "size").write_text(size)
    assert device.last_level_cache_bytes("cpu", sysfs=tmp_path) == 32 * 2**20
    monkeypatch.setattr(sys, "platform", "linux")
    assert device.last_level_cache_bytes("cpu", sysfs=tmp_path / "nothing") is None
    assert device._size_bytes("1M") == 2**20 and device._size_bytes("512") == 512
