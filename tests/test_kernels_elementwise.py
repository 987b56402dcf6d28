"""labkit.kernels.vector_add and bias_gelu against float64 references (Triton interpreter on the CPU)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import labkit
from labkit import kernels
from labkit.kernels import _common
from labkit.kernels.bias_gelu import bias_gelu_backward
from labkit.paths import child_env

DEV = labkit.current().device
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEV).to(dtype)


def test_importing_labkit_does_not_import_triton():
    code = ("import os, sys, labkit; assert 'triton' not in sys.modules, 'labkit imported triton'; "
            "from labkit import kernels; assert 'triton' in sys.modules; "
            "print(labkit.current().triton_interpreter, os.environ.get('TRITON_INTERPRET'))")
    root = Path(__file__).resolve().parent.parent
    env = child_env(root)
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True, env=env)
    interp, env = out.stdout.split()
    assert (env == "1") == (interp == "True")


@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_add(dtype, poison_outputs, close64):
    for shape in [(37,), (5, 129), (4097,)]:
        x, y = randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)
        z = kernels.vector_add(x, y)
        assert z.dtype == dtype and z.shape == x.shape
        close64(z, x.double() + y.double())


def test_vector_add_non_contiguous(poison_outputs, close64):
    x = randn(129, 7).t()  # transposed
    y = randn(7, 200)[:, 3:132]  # sliced rows
    close64(kernels.vector_add(x, y), x.double() + y.double())


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gelu_forward_and_backward(dtype, poison_outputs, close64):
    x = randn(3, 5, 37, dtype=dtype).requires_grad_()
    b = randn(37, dtype=dtype).requires_grad_()
    y = kernels.bias_gelu(x, b)
    assert y.dtype == dtype and y.shape == x.shape
    x64, b64 = x.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    y64 = kernels.bias_gelu.reference(x64, b64)
    close64(y, y64)
    dy = randn(3, 5, 37, dtype=dtype)
    dx, db = torch.autograd.grad(y, (x, b), dy)
    dx64, db64 = torch.autograd.grad(y64, (x64, b64), dy.double())
    close64(dx, dx64)
    close64(db, db64, scale=4)  # a sum over 15 rows, rounded once


def test_bias_gelu_non_contiguous_and_many_rows(poison_outputs, close64):
    base = randn(300, 70)
    x = base[:, 1:66]  # a view: row stride 70, unit column stride
    b = randn(65)
    y = kernels.bias_gelu(x, b)
    close64(y, kernels.bias_gelu.reference(x.double(), b.double()))
    xt = randn(65, 9).t().requires_grad_()  # transposed: the last dim is not contiguous
    bt = randn(65).requires_grad_()
    dy = randn(9, 65)
    dx, db = torch.autograd.grad(kernels.bias_gelu(xt, bt), (xt, bt), dy)
    x64, b64 = xt.detach().double().requires_grad_(), bt.detach().double().requires_grad_()
    dx64, db64 = torch.autograd.grad(kernels.bias_gelu.reference(x64, b64), (x64, b64), dy.double())
    close64(dx, dx64)
    close64(db, db64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fused", [True, False])
def test_bias_gelu_backward_with_many_row_tiles(dtype, fused, poison_outputs, close64, monkeypatch):
    # Row tiles of 8 (fp32) or 4 rows and 3 or 2 column blocks, more tiles than programs (in the interpreter):
    # each program loops over several tiles and sums them; the last row tile and column block are partly masked.
    # dbias added up by the kernel's last programs (fused) or, as under a CUDA graph's capture, by sum_partials.
    if not fused:
        monkeypatch.setattr(kernels._common, "arrival_counter", lambda device: None)
    x, b, dy = randn(50, 1500, dtype=dtype), randn(1500, dtype=dtype), randn(50, 1500, dtype=dtype)
    _bias_gelu_backward_matches_float64(x, b, dy, close64)
    if fused:  # the counter is left at zero for the next launch
        assert kernels._common.arrival_counter(x.device).item() == 0


def test_backward_partials_scratch_is_kept_grown_and_never_read_stale(close64):
    # The fused backward's fp32 partials go to scratch kept with the stream's counter (no allocation a call): it
    # grows for a larger call, stays for a smaller one, and what an earlier call left there (poisoned with NaN
    # here) never reaches a later call's dbias.
    x, b, dy = randn(40, 300), randn(300), randn(40, 300)
    counter = _common.arrival_counter(x.device)
    _common._SCRATCH.pop(id(counter), None)  # (a cache: earlier tests' larger calls may have grown it)
    _bias_gelu_backward_matches_float64(x, b, dy, close64)
    kept = _common._SCRATCH[id(counter)]
    kept.fill_(float("nan"))
    small = randn(9, 33), randn(33), randn(9, 33)
    _bias_gelu_backward_matches_float64(*small, close64)
    assert _common._SCRATCH[id(counter)] is kept  # smaller: the same scratch
    big = randn(70, 2100), randn(2100), randn(70, 2100)
    _bias_gelu_backward_matches_float64(*big, close64)
    assert _common._SCRATCH[id(counter)].numel() > kept.numel()  # larger: grown


def _bias_gelu_backward_matches_float64(x, b, dy, close64):
    dx, db = bias_gelu_backward(dy, x, b)
    x64, b64 = x.double().requires_grad_(), b.double().requires_grad_()
    dx64, db64 = torch.autograd.grad(kernels.bias_gelu.reference(x64, b64), (x64, b64), dy.double())
    close64(dx, dx64)
    close64(db, db64, scale=4 if x.shape[0] < 100 else 20)


def test_bias_gelu_backward_of_no_rows():
    dx, db = bias_gelu_backward(randn(0, 7), randn(0, 7), randn(7))
    assert dx.shape == (0, 7) and db.shape == (7,) and (db == 0).all()


@pytest.mark.skipif(DEV.type != "cuda", reason="full size on a GPU (the interpreter would take many minutes)")
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gelu_backward_at_full_size_on_gpu(dtype, close64):
    x, b, dy = randn(4096, 4096, dtype=dtype), randn(4096, dtype=dtype), randn(4096, 4096, dtype=dtype)
    _bias_gelu_backward_matches_float64(x, b, dy, close64)
    # dbias's sums go in a fixed order: the same bits every call, and under a CUDA graph (sum_partials) as eagerly
    first = [bias_gelu_backward(dy, x, b)[1] for _ in range(3)]
    assert all(torch.equal(first[0], again) for again in first[1:])
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        bias_gelu_backward(dy, x, b)  # warm-up on the capture's stream
        with torch.cuda.graph(graph, stream=stream):
            captured = bias_gelu_backward(dy, x, b)[1]
    graph.replay()
    torch.cuda.synchronize()
    _bias_gelu_backward_matches_float64(x, b, dy, close64)  # eager calls after the capture still add up right
    torch.testing.assert_close(captured, first[0], rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=1e-5)


def test_bad_inputs_say_what_to_do():
    x = randn(4, 8)
    with pytest.raises(TypeError, match="float64.*accepted: float32, float16, bfloat16"):
        kernels.vector_add(x.double(), x.double())
    with pytest.raises(ValueError, match=r"expected y of shape \(4, 8\), got \(4, 7\)"):
        kernels.vector_add(x, randn(4, 7))
    with pytest.raises(TypeError, match="share one dtype"):
        kernels.vector_add(x, x.half())
    with pytest.raises(ValueError, match=r"bias must have shape .*\(8,\).*got .*\(7,\)"):
        kernels.bias_gelu(x, randn(7))
    with pytest.raises(ValueError, match="meta"):
        kernels.vector_add(torch.empty(4, 8, device="meta"), x)
    with pytest.raises(TypeError, match="torch.Tensor"):
        kernels.bias_gelu([1.0], x)


def test_wrong_device_messages(monkeypatch):
    x = torch.randn(4, 8)
    # As the kernels were built for the GPU: a CPU tensor is told to move with .to("cuda").
    monkeypatch.setattr(_common, "INTERPRETED", False)
    with pytest.raises(ValueError, match=r"x is on cpu.*x\.to\('cuda'\)"):
        _common.check_tensor("vector_add", "x", x)
    # As the kernels run in the interpreter: a GPU (here: meta) tensor is told to move with .cpu().
    monkeypatch.setattr(_common, "INTERPRETED", True)
    with pytest.raises(ValueError, match=r"x\.cpu\(\)"):
        _common.check_tensor("vector_add", "x", torch.empty(2, device="meta"))


def test_byte_counts():
    assert kernels.vector_add.min_bytes(1000, torch.float32) == 12000
    assert kernels.vector_add.min_bytes(1000, torch.bfloat16) == 6000
    assert kernels.bias_gelu.min_bytes((10, 100), torch.float32) == (2000 + 100) * 4
    assert kernels.bias_gelu.min_bytes((10, 100), torch.float16, backward=True) == (3000 + 200) * 2


@pytest.mark.parametrize("op", ["vector_add", "softmax", "matmul"])
def test_bf16_results_round_to_nearest_like_the_gpu(op):
    """The interpreter used to truncate fp32 -> bf16 (a quarter of elements one ulp low); GPUs round to
    nearest even. Rounding the kernel's own fp32 result must give exactly the bf16 it returns."""
    torch.manual_seed(1)
    if op == "vector_add":
        x, y = randn(4097, dtype=torch.bfloat16), randn(4097, dtype=torch.bfloat16)
        got, exact32 = kernels.vector_add(x, y), x.float() + y.float()  # fp32 sum of bf16 values is exact
    elif op == "softmax":
        x = randn(17, 129, dtype=torch.bfloat16)
        got, exact32 = kernels.softmax(x), kernels.softmax(x.float())
    else:
        a, b = randn(33, 65, dtype=torch.bfloat16), randn(65, 17, dtype=torch.bfloat16)
        got, exact32 = kernels.matmul(a, b), kernels.matmul(a.float(), b.float())
    rounded = exact32.to(torch.bfloat16)  # PyTorch: round to nearest even
    if op == "vector_add":
        assert torch.equal(got, rounded), f"{(got != rounded).float().mean():.0%} of elements differ"
    else:  # fp32 paths may differ in their last fp32 bits; never by a whole bf16 ulp in a quarter of places
        assert (got != rounded).float().mean() < 0.02


def test_launcher_keys_on_what_triton_specialises():
    # The cached launch may reuse a binary only for arguments Triton would have compiled it for.
    from labkit.kernels._launch import spec as _spec
    assert _spec(32) == (True, False, True, False) and _spec(1) == (False, True, True, False)
    assert _spec(33) == (False, False, True, False)
    assert _spec(2**31) == (True, False, False, False)  # needs 64 bits: another binary
    assert _spec(2**63) == (True, False, False, True)  # unsigned 64 bits: another again
    assert _spec(1.5) is float and _spec(True) is bool
    t = torch.zeros(8)
    assert _spec(t) == (torch.float32, True) and _spec(t[1:]) == (torch.float32, False)


def test_launcher_keys_tma_descriptors_on_their_dtype_and_block():
    # matmul's one TMA launcher serves every dtype: descriptors of fp16 and bf16 tiles need two binaries.
    pytest.importorskip("triton.tools.tensor_descriptor")
    from triton.tools.tensor_descriptor import TensorDescriptor

    from labkit.kernels._launch import spec as _spec
    h, b = (TensorDescriptor.from_tensor(torch.zeros(32, 32, dtype=d), [16, 16])
            for d in (torch.float16, torch.bfloat16))
    assert _spec(h) != _spec(b)
    assert _spec(h) == _spec(TensorDescriptor.from_tensor(torch.ones(64, 32, dtype=torch.float16), [16, 16]))
    assert _spec(h) != _spec(TensorDescriptor.from_tensor(torch.zeros(32, 32, dtype=torch.float16), [32, 16]))


def test_pipeline_stages_fit_shared_memory(monkeypatch):
    # A GPU with 100 KB of shared memory per program (16 KB kept for Triton's reductions).
    from labkit.kernels import _common
    monkeypatch.setattr(_common, "shared_memory", lambda device: 100 * 1024)
    gpu = torch.device("cuda")
    assert _common.pipeline_stages(gpu, 16 * 1024, 3) == 3
    assert _common.pipeline_stages(gpu, 32 * 1024, 3) == 2
    assert _common.pipeline_stages(gpu, 64 * 1024, 3) == 1  # room for one copy only: not pipelined
