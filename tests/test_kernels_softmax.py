"""labkit.kernels.softmax (one-pass and online) against a float64 reference (interpreter on the CPU)."""
import pytest
import torch

import labkit
from labkit import kernels

DEV = labkit.current().device


def randn(*shape, dtype=torch.float32, scale=3.0):
    return (scale * torch.randn(*shape, device=DEV)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("online", [False, True], ids=["one-pass", "online"])
def test_softmax_matches_float64(dtype, online, poison_outputs, close64):
    for shape in [(3, 37), (2, 3, 129), (1,), (17, 1)]:
        x = randn(*shape, dtype=dtype)
        y = kernels.softmax(x, online=online)
        assert y.dtype == dtype and y.shape == x.shape
        close64(y, torch.softmax(x.double(), dim=-1))


def test_online_softmax_spans_several_chunks(poison_outputs, close64, monkeypatch):
    mod = kernels.modules()["softmax"]
    monkeypatch.setattr(mod, "ONLINE_BLOCK", 64)  # rows of 333 take six chunks, the last one partial
    x = randn(5, 333)
    x[1, 300] = 40.0  # the row maximum arrives late: earlier sums must be rescaled
    close64(kernels.softmax(x, online=True), torch.softmax(x.double(), dim=-1))
    # The automatic choice streams rows longer than the one-pass limit.
    monkeypatch.setitem(mod.MAX_FUSED_COLS, torch.float32, 128)
    close64(kernels.softmax(x), torch.softmax(x.double(), dim=-1))


def test_softmax_non_contiguous_and_extreme_values(poison_outputs, close64):
    x = randn(9, 200)[:, 5:134]  # strided rows
    close64(kernels.softmax(x), torch.softmax(x.double(), dim=-1))
    xt = randn(37, 6).t()  # last dim not contiguous: copied first
    close64(kernels.softmax(xt), torch.softmax(xt.double(), dim=-1))
    big = torch.tensor([[1000.0, 999.0, -1000.0], [-float("inf"), 0.0, 1.0]], device=DEV)
    close64(kernels.softmax(big), torch.softmax(big.double(), dim=-1))
    close64(kernels.softmax(big, online=True), torch.softmax(big.double(), dim=-1))


def test_softmax_bad_inputs():
    with pytest.raises(TypeError, match="int64.*accepted: float32, float16, bfloat16"):
        kernels.softmax(torch.ones(3, 4, dtype=torch.int64, device=DEV))
    with pytest.raises(ValueError, match="0-d"):
        kernels.softmax(torch.tensor(1.0, device=DEV))
    with pytest.raises(ValueError, match="meta"):
        kernels.softmax(torch.empty(3, 4, device="meta"))


def test_softmax_counts():
    assert kernels.softmax.min_bytes((16, 1024), torch.float32) == 2 * 16 * 1024 * 4
    assert kernels.softmax.min_bytes((16, 1024), torch.bfloat16) == 2 * 16 * 1024 * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_split_rows_match_float64(dtype, poison_outputs, close64, monkeypatch):
    # Every dtype through the Triton split path (forced: by default only long rows, or few rows, are split;
    # on a Hopper GPU the cluster kernel would take them, see the tests below).
    mod = kernels.modules()["softmax"]
    monkeypatch.setattr(mod, "MAX_CLUSTER", 0)
    monkeypatch.setattr(mod, "SPLIT_CHUNK", 64)  # rows of 333 take six chunks, the last one partial
    x = randn(5, 333, dtype=dtype)
    x[1, 300] = 40.0  # the row maximum sits in the last chunk
    x[3, :200] = -float("inf")  # whole chunks of -inf (masked attention): their sums must count as 0
    x[4] *= 30  # chunk maxima far apart: each chunk's exp(x - chunk max) is rescaled by exp(chunk max - row max)
    close64(kernels.softmax(x, split=True), torch.softmax(x.double(), dim=-1))
    xs = randn(3, 400, dtype=dtype)[:, 7:300]  # strided rows of 293
    close64(kernels.softmax(xs, split=True), torch.softmax(xs.double(), dim=-1))
    one = randn(2, 40, dtype=dtype)  # a single chunk per row
    close64(kernels.softmax(one, split=True), torch.softmax(one.double(), dim=-1))


def test_split_is_chosen_for_long_or_few_rows():
    from labkit.kernels.softmax import MAX_FUSED_COLS, use_split
    cpu = torch.device("cpu")
    assert use_split(1024, MAX_FUSED_COLS[torch.float32] + 1, torch.float32, cpu)
    assert not use_split(65536, 1024, torch.bfloat16, cpu)
    assert use_split(2, 16384, torch.float32, cpu)  # two rows: chunks give the SMs work
    assert not use_split(2, 1024, torch.float32, cpu)
    assert use_split(1024, 65536, torch.bfloat16, cpu)  # 16-bit long rows split too (one exp per element)
    assert not use_split(1024, MAX_FUSED_COLS[torch.bfloat16], torch.bfloat16, cpu)


def test_cluster_size_covers_the_row_in_powers_of_two(monkeypatch):
    from labkit.kernels.softmax import cluster_size
    mod = kernels.modules()["softmax"]
    monkeypatch.setattr(mod, "CLUSTER_THREADS", 512)
    monkeypatch.setattr(mod, "CLUSTER_VECS", 8)  # 64 KB a block: 16384 fp32 or 32768 16-bit elements
    assert cluster_size(65536, torch.float32) == 4 and cluster_size(65536, torch.bfloat16) == 2
    assert cluster_size(131072, torch.float32) == 8 and cluster_size(40000, torch.float32) == 4
    assert cluster_size(100, torch.float32) == 2  # at least two blocks: one row to a block is the fused kernel
    assert cluster_size(16 * 16384, torch.float32) == 16 and cluster_size(16 * 16384 + 4, torch.float32) is None
    # Blocks staging 8 more vectors a thread in shared memory hold 128 KB, and may take a row alone.
    assert cluster_size(65536, torch.bfloat16, staged=8) == 1 and cluster_size(100, torch.float32, staged=8) == 1
    assert cluster_size(131072, torch.bfloat16, staged=8) == 2 and cluster_size(131072, torch.float32, staged=8) == 4
    assert cluster_size(40000, torch.float32, staged=8) == 2


def test_cluster_launch_stages_rows_in_shared_memory_then_takes_smaller_blocks_for_few_rows(monkeypatch):
    from labkit.kernels.softmax import cluster_launch
    mod = kernels.modules()["softmax"]
    for name, value in [("CLUSTER_THREADS", 512), ("CLUSTER_VECS", 8), ("CLUSTER_STAGED_VECS", 8), ("MAX_CLUSTER", 16),
                        ("CLUSTER_MIN_BLOCKS_PER_SM", 12), ("num_sms", lambda device: 132)]:
        monkeypatch.setattr(mod, name, value)
    cpu, bf16, fp32 = torch.device("cpu"), torch.bfloat16, torch.float32
    # (threads, staged vectors a thread, blocks a row): staged blocks wherever they still give a block per SM
    assert cluster_launch(1024, 65536, bf16, cpu) == (512, 8, 1)
    assert cluster_launch(256, 131072, fp32, cpu) == (512, 8, 4)
    assert cluster_launch(256, 131072, bf16, cpu) == (512, 8, 2)
    assert cluster_launch(66, 131072, bf16, cpu) == (512, 8, 2)  # 132 blocks: one per SM
    assert cluster_launch(100, 32 * 16384, fp32, cpu) == (512, 8, 16)  # too long for blocks without staging
    # too few rows for that: plain blocks, or half-size ones when those are too few
    assert cluster_launch(65, 131072, bf16, cpu) == (256, 0, 8)
    assert cluster_launch(20, 65536, bf16, cpu) == (256, 0, 4)
    assert cluster_launch(4, 16 * 16384, fp32, cpu) == (512, 0, 16)  # smaller blocks would need 32 to a row
    assert cluster_launch(4, 16 * 16384 + 4, fp32, cpu) is None


HOPPER = DEV.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.skipif(not HOPPER, reason="thread-block clusters need a Hopper (sm_90) GPU or newer")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cluster_kernel_matches_float64(dtype, poison_outputs, close64, monkeypatch):
    # Long rows on Hopper: the cluster kernel at the bench's full sizes, odd widths (a cluster's last blocks
    # partly or wholly past the row), strided rows, many rows, whole chunks of -inf, rows rising and falling
    # (each group's exps are taken against the maximum so far, groups go in the order they land) and a late maximum;
    # blocks staging part of their chunk in shared memory, that part full, partial (20000, 140000) or empty (104).
    mod = kernels.modules()["softmax"]
    split = []
    monkeypatch.setattr(mod, "_softmax_split", lambda *a: split.append(a))  # the Triton path must not run
    for rows, cols in [(1024, 65536), (256, 131072), (5, 40000), (3001, 20000), (3, 16392), (7, 8), (200, 140000),
                       (300, 104)]:
        x = randn(rows, cols + 64, dtype=dtype)[:, 64:]  # strided rows, each 16-byte aligned
        x[0, : cols // 2] = -float("inf")
        x[1] = torch.linspace(-20.0, 20.0, cols, device=DEV)  # maxima that grow at every step, in either order
        x[2] = torch.linspace(20.0, -20.0, cols, device=DEV)
        if rows > 3:
            x[3] *= 8  # a wide row: many outputs far below the largest, some under 1e-12
        x[-1, -1] = 40.0
        y = kernels.softmax(x, split=True)
        ref = torch.softmax(x.double(), dim=-1)
        close64(y, ref)
        # Relative error at every size of output, not only against close64's absolute floor (outputs of long rows
        # are ~1/cols, far under it): 16-bit rows keep exp(x - m) as fp16 x 2^15, exact to 2^-40 absolute.
        floor = {torch.float32: 2.0**-120, torch.bfloat16: 2.0**-39, torch.float16: 2.0**-24}[dtype]
        close64(y, ref, atol=floor)
        assert y.is_contiguous()
    assert not split, "the Triton split kernel ran where the cluster kernel should have"


@pytest.mark.skipif(not HOPPER, reason="thread-block clusters need a Hopper (sm_90) GPU or newer")
def test_rows_the_cluster_kernel_cannot_take_go_to_triton(poison_outputs, close64, monkeypatch):
    # Rows not in whole 16-byte vectors (odd widths, odd strides, an odd start) and rows longer than 16 blocks.
    mod = kernels.modules()["softmax"]
    ran = []
    real = mod._softmax_split
    monkeypatch.setattr(mod, "_softmax_split", lambda *a: (ran.append(a[0].shape), real(*a)))
    for x in [randn(3, 40001), randn(3, 40008)[:, 1:40001], randn(2, 16 * 16384 + 4),
              randn(3, 65537, dtype=torch.bfloat16)[:, 1:]]:
        close64(kernels.softmax(x, split=True), torch.softmax(x.double(), dim=-1))
    assert len(ran) == 4


@pytest.mark.skipif(not HOPPER or torch.cuda.device_count() < 2, reason="needs two Hopper GPUs")
def test_cluster_kernel_runs_on_the_tensors_gpu(poison_outputs, close64):
    # Compiled and launched for the GPU holding x, whichever GPU is current.
    x = randn(6, 65536).to("cuda:1")
    assert torch.cuda.current_device() == 0
    close64(kernels.softmax(x), torch.softmax(x.double(), dim=-1))
    with torch.cuda.device(1):
        x0 = randn(6, 65536, dtype=torch.bfloat16).to("cuda:0")
        close64(kernels.softmax(x0), torch.softmax(x0.double(), dim=-1))
