"""labkit.kernels.cluster.rtc: kernels compiled at run time by NVRTC; what happens where they cannot be."""
import pytest
import torch

import labkit
from labkit.kernels.cluster import rtc

DEV = labkit.current().device


def test_compile_says_what_is_missing(monkeypatch):
    monkeypatch.delattr(torch.cuda, "_compile_kernel", raising=False)
    rtc.compile_kernel.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="no torch.cuda._compile_kernel.*2.8 or later"):
            rtc.compile_kernel("softmax_cluster.cu", "softmax_cluster", 0, ELEM=0, CLUSTER=2, THREADS=32, VECS=1)
    finally:
        rtc.compile_kernel.cache_clear()


def test_a_kernel_that_cannot_be_built_gives_a_warning_and_none(monkeypatch):
    # Where NVRTC or clusters are missing, callers take their Triton path, and the student is told why, once.
    def no_nvrtc(*args, **kwargs):
        raise RuntimeError("no NVRTC here")
    monkeypatch.setattr(rtc, "compile_kernel", no_nvrtc)
    rtc.cluster_kernel.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="softmax: long rows take the Triton kernel.*no NVRTC here"):
            assert rtc.cluster_kernel("softmax", "softmax_cluster.cu", "softmax_cluster", 0, CLUSTER=4,
                                      THREADS=512) is None
    finally:
        rtc.cluster_kernel.cache_clear()


def test_the_element_types_match_the_header():
    header = (rtc.SOURCE_DIR / "cluster.cuh").read_text()
    assert "fp32 / bf16 / fp16 (ELEM 0 / 1 / 2)" in header
    assert rtc.ELEM == {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@pytest.mark.skipif(DEV.type != "cpu", reason="the interpreter's path")
def test_the_interpreter_never_asks_for_a_cuda_kernel():
    from labkit import kernels
    sm, ln = kernels.modules()["softmax"], kernels.modules()["layer_norm"]
    x = torch.randn(2, 64)
    assert not sm._softmax_cluster(x, torch.empty(2, 64))
    assert ln._backward_cluster(x, x, torch.randn(64), torch.zeros(2), torch.ones(2), torch.empty(2, 64)) is None


@pytest.mark.skipif(DEV.type != "cuda" or not rtc.has_clusters(0), reason="needs a Hopper (sm_90) GPU or newer")
@pytest.mark.parametrize("static", [True, False])
def test_both_launch_paths_give_the_same_result(static, monkeypatch):
    # A compiled kernel launches through PyTorch's static launcher where this PyTorch has one, else through ctypes;
    # each path gives the softmax of strided rows (pointers and 32-bit ints in order), bit for bit the same.
    from labkit import kernels
    sm = kernels.modules()["softmax"]
    x = torch.randn(300, 40064, device=DEV)[:, 64:]
    kept = sm.softmax(x, split=True)
    if not static:
        monkeypatch.setattr(rtc, "_static_launch", None)
    elif rtc._static_launch is None:
        pytest.skip("this PyTorch has no static launcher")
    y = torch.full_like(kept, float("nan"))
    sm._softmax_cluster(x, y)
    assert torch.equal(y, kept)
    torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), rtol=1e-5, atol=1e-9)
