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
