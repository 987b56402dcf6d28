"""labkit.kernels.layer_norm forward and backward against float64 autograd (interpreter on the CPU)."""
import pytest
import torch

import labkit
from labkit import kernels
from labkit.kernels.layer_norm import layer_norm_backward, layer_norm_forward

DEV = labkit.current().device


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEV).to(dtype)


def grads64(x, w, b, dy, eps=1e-5):
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64 = kernels.layer_norm.reference(x64, w64, b64, eps)
    return (y64, *torch.autograd.grad(y64, (x64, w64, b64), dy.double()))


def check_kernels(x, w, b, dy, close64, sums_scale):
    """The forward and backward kernels against float64 autograd (dweight, dbias: sums over rows)."""
    y, mean, rstd = layer_norm_forward(x, w, b)
    dx, dw, db = layer_norm_backward(dy, x, w, mean, rstd)
    y64, dx64, dw64, db64 = grads64(x, w, b, dy)
    close64(y, y64)
    close64(dx, dx64, scale=2)
    close64(dw, dw64, scale=sums_scale)
    close64(db, db64, scale=sums_scale)
    return mean, rstd


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_layer_norm_forward_backward(dtype, poison_outputs, close64):
    x = (randn(2, 3, 37, dtype=torch.float32) * 2 + 0.5).to(dtype).requires_grad_()
    w = randn(37, dtype=dtype).requires_grad_()
    b = randn(37, dtype=dtype).requires_grad_()
    y = kernels.layer_norm(x, w, b)
    assert y.dtype == dtype and y.shape == x.shape
    dy = randn(2, 3, 37, dtype=dtype)
    y64, dx64, dw64, db64 = grads64(x, w, b, dy)
    close64(y, y64)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    close64(dx, dx64, scale=2)
    close64(dw, dw64, scale=4)  # sums over 6 rows, rounded once
    close64(db, db64, scale=4)


def test_layer_norm_non_contiguous_and_eps(poison_outputs, close64):
    base = randn(11, 150).requires_grad_()
    xv = base[:, 7:136]  # strided rows of 129
    w, b = randn(129).requires_grad_(), randn(129).requires_grad_()
    dy = randn(129, 11).t()  # a non-contiguous upstream gradient
    y = kernels.layer_norm(xv, w, b, eps=1e-3)
    y64, dx64, dw64, db64 = grads64(xv, w, b, dy, eps=1e-3)
    close64(y, y64)
    dbase, dw, db = torch.autograd.grad(y, (base, w, b), dy)
    close64(dbase[:, 7:136], dx64, scale=2)
    assert (dbase[:, :7] == 0).all() and (dbase[:, 136:] == 0).all()
    close64(dw, dw64, scale=2)
    close64(db, db64, scale=2)


@pytest.mark.parametrize("stages", [1, 3])
def test_layer_norm_backward_many_rows_per_program(stages, poison_outputs, close64, monkeypatch):
    # Rows of 5 pack 512 to a tile; 10 tiles for 4 programs: each loops two or three times, pipelined
    # (stages 3, on a GPU) or not.
    mod = kernels.modules()["layer_norm"]
    monkeypatch.setattr(mod, "BWD_STAGES", stages)
    monkeypatch.setattr(mod, "num_sms", lambda device: 4)
    assert mod._bwd_plan(5000, 5, torch.float32, torch.device(DEV))[:2] == (4, 512)
    x, w, b, dy = randn(5000, 5), randn(5), randn(5), randn(5000, 5)
    y, mean, rstd = layer_norm_forward(x, w, b)
    dx, dw, db = layer_norm_backward(dy, x, w, mean, rstd)
    y64, dx64, dw64, db64 = grads64(x, w, b, dy)
    close64(y, y64)
    close64(dx, dx64)
    close64(dw, dw64, scale=10)
    close64(db, db64, scale=10)
    torch.testing.assert_close(mean.double(), x.double().mean(-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fused", [True, False])
def test_layer_norm_backward_sums_many_partial_rows(dtype, fused, poison_outputs, close64, monkeypatch):
    # 100 (fp32) or 50 row tiles, one program each: more partial rows than one block of rows of the final sum,
    # added up by the kernel's last programs (fused, finish_partials) or, as under a CUDA graph's capture, by
    # sum_partials.
    mod = kernels.modules()["layer_norm"]
    monkeypatch.setattr(mod, "num_sms", lambda device: 100)
    if not fused:
        monkeypatch.setattr(kernels._common, "arrival_counter", lambda device: None)
    x, w, b, dy = (randn(400, 700, dtype=dtype) * 2 - 1), randn(700, dtype=dtype), randn(700, dtype=dtype), \
        randn(400, 700, dtype=dtype)
    _, mean, rstd = layer_norm_forward(x, w, b)
    dx, dw, db = layer_norm_backward(dy, x, w, mean, rstd)
    _, dx64, dw64, db64 = grads64(x, w, b, dy)
    assert dw.dtype == db.dtype == dtype
    close64(dx, dx64, scale=2)
    close64(dw, dw64, scale=20)  # sums of 400 rows (fp32 accumulation), rounded once
    close64(db, db64, scale=20)
    if fused:
        assert kernels._common.arrival_counter(x.device).item() == 0  # left at zero for the next launch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("wide", [False, True])
def test_forward_paths(dtype, wide, poison_outputs, close64, monkeypatch):
    # Forward tiles of two rows (16-bit rows of 4096+), or the wide-row loop (rows wider than 8192: one row
    # at a time, a program per SM, pipelined), on odd sizes and a strided x; 301 rows over 4 programs loop.
    mod = kernels.modules()["layer_norm"]
    monkeypatch.setitem(mod.FWD_TWO_ROWS_FROM, dtype, 200)
    monkeypatch.setattr(mod, "num_sms", lambda device: 4)
    if wide:
        monkeypatch.setattr(mod, "FWD_WIDE", (200, 4, 3))
    base = randn(301, 260, dtype=dtype) * 3 + 1
    x = base[:, 3:258]  # strided rows of 255, 301 of them: the last tile is mostly padding rows
    programs, bm, _, _, stages = mod._fwd_plan(301, 255, dtype, torch.device(DEV))
    assert (programs, bm, stages > 0) == (4, 1, True) if wide else (programs * bm >= 301 and bm >= 2 and not stages)
    w, b, dy = randn(255, dtype=dtype), randn(255, dtype=dtype), randn(301, 255, dtype=dtype)
    check_kernels(x, w, b, dy, close64, sums_scale=20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sum_partials_adds_each_stack_and_rounds_once(dtype):
    from labkit.kernels._common import sum_partials
    partial = randn(3, 77, 131)  # three stacks of 77 rows: more than one block of rows and of columns
    out = sum_partials(partial, dtype)
    assert out.shape == (3, 131) and out.dtype == dtype
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]  # one rounding to dtype
    torch.testing.assert_close(out.double(), partial.double().sum(1), rtol=tol, atol=tol * 10)


def test_layer_norm_bad_inputs():
    x, w = randn(3, 8), randn(8)
    with pytest.raises(ValueError, match=r"weight must have shape .*\(8,\); got \(9,\)"):
        kernels.layer_norm(x, randn(9), w)
    with pytest.raises(TypeError, match="share one dtype"):
        kernels.layer_norm(x, w.half(), w)
    with pytest.raises(TypeError, match="float64.*accepted"):
        kernels.layer_norm(x.double(), w.double(), w.double())
    with pytest.raises(ValueError, match="longer than this kernel's limit"):
        kernels.layer_norm(torch.empty(1, 16385, device=DEV), torch.empty(16385, device=DEV),
                           torch.empty(16385, device=DEV))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_split_rows_backward(dtype, poison_outputs, close64, monkeypatch):
    # Backward rows split across programs (by default only rows wider than 8192): chunks of 64 columns, so a
    # row of 255 gives four chunks, the last one short; two row groups walk 37 strided rows; dy is strided.
    mod = kernels.modules()["layer_norm"]
    monkeypatch.setattr(mod, "_backward_cluster", lambda *a: None)  # the Triton split, on a Hopper GPU too
    monkeypatch.setattr(mod, "BWD_SPLIT", (1, 64, 4, 2))
    monkeypatch.setattr(mod, "num_sms", lambda device: 4)  # two row groups on a GPU too
    assert mod._split_plan(37, 255, torch.device(DEV))[1:3] == (4, 2)
    x = (randn(37, 260) * 3 + 2).to(dtype)[:, 2:257]
    w, b = randn(255, dtype=dtype), randn(255, dtype=dtype)
    dy = randn(255, 37, dtype=dtype).t()
    mean, rstd = check_kernels(x, w, b, dy, close64, sums_scale=10)
    torch.testing.assert_close(mean.double(), x.double().mean(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd.double(), 1 / (x.double().var(-1, unbiased=False) + 1e-5).sqrt(), rtol=1e-4,
                               atol=0)


def test_split_rows_one_row_and_a_group_per_row(poison_outputs, close64, monkeypatch):
    mod = kernels.modules()["layer_norm"]
    monkeypatch.setattr(mod, "_backward_cluster", lambda *a: None)
    monkeypatch.setattr(mod, "BWD_SPLIT", (1, 32, 4, 8))
    for rows in (1, 3):
        assert mod._split_plan(rows, 100, torch.device(DEV))[2] == rows
        check_kernels(randn(rows, 100) * 2 - 1, randn(100), randn(100), randn(rows, 100), close64, sums_scale=4)


def test_split_is_chosen_for_rows_wider_than_8192():
    mod = kernels.modules()["layer_norm"]
    cpu = torch.device("cpu")
    assert mod._split_plan(4096, 8192, cpu) is None
    chunk, splits, groups, _ = mod._split_plan(4096, 16384, cpu)
    assert chunk * splits == 16384 and groups >= 1
    assert mod._split_plan(1, 9000, cpu)[1:3] == (3, 1)  # three chunks, the last short; one row, one group


@pytest.mark.skipif(DEV.type != "cuda", reason="full size on a GPU (the interpreter would take many minutes)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, cols", [(4096, 16384), (8192, 8192)])
def test_wide_rows_at_full_size_on_gpu(rows, cols, dtype, close64):
    # The default tiles on the GPU: at 16384 columns the forward's pipelined loop and the split backward;
    # at 8192 two-row (16-bit) or one-row forward tiles and the pipelined whole-row backward.
    mod = kernels.modules()["layer_norm"]
    assert (mod._split_plan(rows, cols, DEV) is not None) == (cols > 8192)
    x, w, b, dy = (randn(rows, cols) * 2 + 1).to(dtype), randn(cols, dtype=dtype), randn(cols, dtype=dtype), \
        randn(rows, cols, dtype=dtype)
    check_kernels(x, w, b, dy, close64, sums_scale=20)


HOPPER = DEV.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.skipif(not HOPPER, reason="thread-block clusters need a Hopper (sm_90) GPU or newer")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cluster_backward_matches_float64(dtype, poison_outputs, close64, monkeypatch):
    # Rows wider than 8192 on Hopper: the cluster kernel at full size, at widths that leave a cluster's last
    # block short or blocks with no columns at all (40000), with fewer rows than clusters and with many rows to
    # each cluster (its ring of shared-memory stages goes round many times); x strided, and dy in one case.
    mod = kernels.modules()["layer_norm"]
    real, took = mod._backward_cluster, []
    monkeypatch.setattr(mod, "_backward_cluster", lambda *a: took.append(real(*a)) or took[-1])
    shapes = [(4096, 16384), (3, 10000), (2000, 8200), (7, 16384), (1000, 40000), (5, 65536)]
    for rows, cols in shapes:
        x = (randn(rows, cols + 8) * 2 + 1).to(dtype)[:, 8:]  # rows start 16-byte aligned
        w, b, dy = randn(cols, dtype=dtype), randn(cols, dtype=dtype), randn(rows, cols + 16, dtype=dtype)
        dy = dy[:, 16:] if cols == 40000 else dy[:, :cols].contiguous()
        check_kernels(x, w, b, dy, close64, sums_scale=20)
    assert len(took) == len(shapes) and all(t is not None for t in took), "the Triton split ran instead"


@pytest.mark.skipif(not HOPPER, reason="thread-block clusters need a Hopper (sm_90) GPU or newer")
def test_cluster_backward_leaves_unaligned_rows_to_triton(poison_outputs, close64):
    mod = kernels.modules()["layer_norm"]
    for x in [randn(5, 10001), randn(5, 10008)[:, 1:10001]]:  # odd width; a start 4 bytes off
        dx = torch.empty_like(x)
        assert mod._backward_cluster(x, x, randn(x.shape[1]), torch.zeros(5, device=DEV), torch.ones(5, device=DEV),
                                     dx) is None
        check_kernels(x, randn(x.shape[1]), randn(x.shape[1]), randn(*x.shape), close64, sums_scale=20)


def test_launch_plans_are_cached_per_kind_of_call_until_cleared(monkeypatch, close64):
    # A plan is worked out once per (M, N, dtype, device); changing a tuning table takes clear_plans(), which the
    # test set-up calls around every test (so a test that patches a table gets plans made from it).
    from labkit.kernels._common import clear_plans
    mod = kernels.modules()["layer_norm"]
    x, w, b = randn(7, 33), randn(33), randn(33)
    layer_norm_forward(x, w, b)
    key = (7, 33, torch.float32, x.device, True)  # (with the statistics kept)
    grid, _, meta = mod._FWD_PLANS[key]
    assert meta["STAGES"] == 0  # whole-row tiles
    monkeypatch.setattr(mod, "FWD_WIDE", (16, 4, 3))  # rows of 16+ columns now take the wide-row loop
    layer_norm_forward(x, w, b)
    assert mod._FWD_PLANS[key][2]["STAGES"] == 0  # the cached plan, until cleared
    clear_plans()
    y, _, _ = layer_norm_forward(x, w, b)
    assert mod._FWD_PLANS[key][2]["STAGES"] > 0 and mod._FWD_PLANS[key][0] == (min(7, mod.num_sms(x.device)),)
    close64(y, kernels.layer_norm.reference(x.double(), w.double(), b.double()))


@pytest.mark.parametrize("shape", [(5, 37), (3, 2, 300), (2, 9000)])
def test_a_forward_without_backward_keeps_no_statistics_and_gives_the_same_output(shape):
    # No graph to record (no grad, or inputs that do not require it): the kernel skips the row statistics, which
    # only the backward reads; y is bit for bit the one the forward with statistics writes.
    x, w, b = randn(*shape, dtype=torch.bfloat16), randn(shape[-1], dtype=torch.bfloat16), randn(shape[-1],
                                                                                                dtype=torch.bfloat16)
    y, mean, rstd = layer_norm_forward(x, w, b)
    y_bare, no_mean, no_rstd = layer_norm_forward(x, w, b, stats=False)
    assert mean is not None and rstd is not None and no_mean is None and no_rstd is None
    assert torch.equal(y, y_bare) and torch.equal(y, kernels.layer_norm(x, w, b))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cols", [1024, 4096, 8192])
def test_a_16_bit_forward_tile_has_at_most_8_warps(dtype, cols, monkeypatch):
    # With 16 warps, bf16 rows of 8192 ran at 75% of an H100's copy bandwidth, with 8 at 94%. The plan as a GPU
    # gets it (the interpreter's one warp turned off).
    from labkit.kernels import _common
    monkeypatch.setattr(_common, "INTERPRETED", False)
    _, bm, bn, warps, stages = kernels.modules()["layer_norm"]._fwd_plan(8192, cols, dtype, torch.device("cpu"))
    assert (bn, stages) == (cols, 0) and 4 <= warps <= 8 and bm * bn // (32 * warps) <= 64
