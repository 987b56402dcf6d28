"""labkit.compat holds every private PyTorch and Triton API labkit uses: none elsewhere, all present on the locked
versions, and a fast path that cannot load degrades with one warning."""
import ast
import importlib.metadata
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from labkit import compat

ROOT = Path(__file__).resolve().parent.parent
LABKIT = ROOT / "labkit"
ALLOWED = {LABKIT / "compat.py", LABKIT / "kernels" / "matmul_tf32.py"}  # the latter is written in Gluon
EXPERIMENTAL = ("triton.experimental", "triton.runtime.interpreter", "triton.runtime.jit", "triton.runtime.driver",
                "triton.tools", "triton.compiler", "triton.backends")
sys.path.insert(0, str(ROOT))
import course  # noqa: E402


def _has_gluon() -> bool:
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        return False
    return True


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _private(name: str) -> bool:
    parts = name.split(".")
    return parts[0] in ("torch", "triton") and (
        any(p.startswith("_") and not p.startswith("__") for p in parts[1:]) or name.startswith(EXPERIMENTAL))


def private_uses(path: Path) -> list[str]:
    """Private or experimental torch/triton names `path` uses in code (not in its docstrings or messages)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = None
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
        elif isinstance(node, ast.ImportFrom) and node.module:
            name = next((f"{node.module}.{a.name}" for a in node.names if _private(f"{node.module}.{a.name}")),
                        node.module)
        elif isinstance(node, ast.Import):
            name = next((a.name for a in node.names if _private(a.name)), None)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            base = _dotted(node.args[0])
            name = f"{base}.{node.args[1].value}" if base else None
        if name and _private(name):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    return found


def test_private_apis_are_used_only_through_labkit_compat():
    found = [u for p in sorted(LABKIT.rglob("*.py")) if p not in ALLOWED for u in private_uses(p)]
    assert not found, "use labkit.compat (and list the hook in its docstring):\n" + "\n".join(sorted(set(found)))


def test_every_hook_is_listed_in_the_docstring():
    doc = compat.__doc__
    for hook in ("triton.experimental.gluon", "TensorDescriptor", "get_device_properties", "JITFunction.run",
                 "torch.cuda._compile_kernel", "_cuda_getCurrentRawStream", "torch._scaled_mm", "torch.cuda._sleep",
                 "torch._dynamo.reset", "donated_buffer", "TorchDispatchMode", "_get_ddp_logging_data"):
        assert hook in doc, hook


def _versions() -> tuple[str, str | None]:
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    return torch.__version__.split("+")[0], triton


def _locked_pair() -> str | None:
    torch_v, triton_v = _versions()
    for kind in ("cpu", "cuda"):
        pair = course.torch_pair(kind)
        if pair["torch"] == torch_v and pair["triton"] == triton_v:
            return kind
    return None


locked_only = pytest.mark.skipif(_locked_pair() is None,
                                 reason="torch %s / triton %s is not a pair in locks/torch.toml" % _versions())


@locked_only
def test_on_the_locked_versions_every_hook_is_there():
    assert compat.gluon_matmul(warn=False) is not None, "the Gluon TF32 kernel does not load on the locked Triton"
    assert compat.tensor_descriptor() is not None
    assert len(compat.launch_classes()) == 2 and compat.triton_interpreter() is not None
    assert compat.nvrtc_compile() is not None and compat.scaled_mm() is not None and compat.gpu_sleep() is not None
    assert compat.dispatch_mode() is not None


@pytest.mark.skipif(not _has_gluon(), reason="this Triton has no Gluon: nothing to degrade")
def test_a_gluon_that_cannot_load_degrades_with_one_warning(monkeypatch):
    real = compat.importlib.import_module

    def broken(name, *args):
        if name == "labkit.kernels.matmul_tf32":
            raise AttributeError("module 'gl' has no attribute 'renamed_thing'")
        return real(name, *args)

    monkeypatch.setattr(compat.importlib, "import_module", broken)
    compat.gluon_matmul.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="TMA kernel.*renamed_thing"):
            assert compat.gluon_matmul() is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert compat.gluon_matmul() is None  # once: cached
            assert compat.gluon_matmul(warn=False) is None
    finally:
        compat.gluon_matmul.cache_clear()


COMPILE = """
import re, sys
import torch
from labkit.kernels import matmul_tf32 as mt
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import _runtime
from triton.runtime.jit import mangle_type
for size, (bm, bn, bk, stages, warps, group) in mt.CONFIGS.items():
    descs = [mt.TensorDescriptor.from_tensor(torch.empty(512, 512), blk,
                                             mt.gl.NVMMASharedLayout.get_default_for(blk, mt.gl.float32))
             for blk in ([bm, bk], [bk, bn], [bm, bn])]
    sig = {name: mangle_type(d) for name, d in zip(("a_desc", "b_desc", "c_desc"), descs)}
    sig.update(GROUP_M="constexpr", STAGES="constexpr")
    src = _runtime.GluonASTSource(mt.matmul_tf32_kernel, sig, constexprs={"GROUP_M": group, "STAGES": stages})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    # wgmma on TF32 whose first operand is a list of registers (B^T), the second a shared-memory descriptor
    assert re.search(r"wgmma\\.mma_async\\.sync\\.aligned\\.m64n\\d+k8\\.f32\\.tf32\\.tf32\\s*\\{[^}]*\\}\\s*,\\s*\\{",
                     k.asm["ptx"]), size
    assert k.metadata.shared <= 227 * 1024, size
    print(size, "ok")
"""


@locked_only
@pytest.mark.skipif(not _has_gluon(), reason="this Triton has no Gluon")
def test_gluon_kernel_compiles_to_tf32_wgmma_from_registers():
    """Compiled for sm_90a in a fresh process (no GPU needed). In the test process it failed only after certain
    tests and only with a cold Triton cache: on a CPU, `labkit bench ... matmul` (tests/test_tools_bench.py) has
    torch.compile call an interpreted @triton.jit function directly, and Triton 3.9's InterpretedFunction.__call__
    patches triton.language.core's builtins (add, ...) with the interpreter's semantic and never restores them;
    a later real compile in that process (gl.cdiv's add) then ran into the interpreter's builder. With a warm
    cache the compile is never traced, so it passed."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "LABKIT_DEVICE")}
    done = subprocess.run([sys.executable, "-c", COMPILE], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("ok") == len(compat.gluon_matmul(warn=False).CONFIGS)


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, dy):
        return dy * 2


def test_autograd_apply_records_the_function_and_hands_functorch_transforms_to_the_wrapper():
    fast = compat.autograd_apply(_Double)
    x = torch.randn(5, requires_grad=True)
    y = fast(x)
    assert type(y.grad_fn).__name__ == "_DoubleBackward"
    torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], torch.full((5,), 2.0))
    # under vmap the wrapper's own path runs: it refuses a Function without setup_context, as _Double.apply does
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.vmap(fast)(torch.randn(3, 4))


def test_autograd_apply_keeps_the_wrapper_for_a_function_with_setup_context():
    class WithSetup(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x):
            return x * 3

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, dy):
            return dy * 3

    assert compat.autograd_apply(WithSetup) == WithSetup.apply
    vmapped = torch.func.vmap(compat.autograd_apply(WithSetup))(torch.ones(2, 3))
    torch.testing.assert_close(vmapped, torch.full((2, 3), 3.0))
