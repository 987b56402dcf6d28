"""labkit.kernels._launch: the launch path that skips Triton's per-call binding keys compiled kernels on all that
Triton specialises on, and falls back to kernel[grid] whenever it cannot be sure (CPU: a stand-in compiled kernel)."""
import importlib

import pytest
import torch
import triton.language as tl
from triton import knobs
from triton.backends.compiler import BaseBackend
from triton.runtime.jit import JITFunction

from labkit.kernels import _launch
from labkit.kernels._common import INTERPRETED

try:
    from triton._C.libtriton import native_specialize_impl
except ImportError:  # an older Triton: the Python specialisation of the same rules
    native_specialize_impl = None


def _args():
    t = torch.zeros(64)
    return [t, t[1:], t[4:], t.to(torch.bfloat16), t.to(torch.bfloat16)[1:], t.to(torch.float16), t.to(torch.int32),
            0, 1, 2, 16, 17, 32, -16, -17, 2**31 - 1, 2**31, 2**31 + 16, -2**31, -2**31 - 1, 2**63 - 1, 2**63,
            2**64 - 1, 1.5, 0.0, True, False, None, (16, t), (17, t), (16, t[1:]), (1.5, None), *_descriptors()]


def _descriptors():
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return []
    return [TensorDescriptor.from_tensor(torch.zeros(32, 32, dtype=d), block) for d in (torch.float16, torch.float32)
            for block in ([16, 16], [32, 16])]


@pytest.mark.skipif(native_specialize_impl is None, reason="this Triton has no native_specialize_impl")
def test_spec_tells_apart_whatever_triton_specialises_apart():
    args = _args()
    triton_spec = [native_specialize_impl(BaseBackend, a, False, True, True) for a in args]
    ours = [_launch.spec(a) for a in args]
    for i in range(len(args)):
        for j in range(len(args)):
            if triton_spec[i] != triton_spec[j]:
                assert ours[i] != ours[j], (args[i], args[j], triton_spec[i], triton_spec[j])


@pytest.mark.skipif(native_specialize_impl is None, reason="this Triton has no native_specialize_impl")
def test_the_generated_binder_tells_apart_what_triton_does_and_hands_over_pointers():
    args = _args()
    # one argument at a time, and pairs of arguments (tensor alignment is keyed for all tensors together)
    calls = [(a,) for a in args] + [(a, b) for a in args[:8] for b in args]
    keys = {}
    for call in calls:
        kinds = tuple(map(type, call))
        key, values = _launch.binder(kinds)(call)
        assert values == tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in call)
        triton_key = tuple(native_specialize_impl(BaseBackend, a, False, True, True) for a in call)
        keys.setdefault((kinds, key), set()).add(triton_key)
    clashes = {k: v for k, v in keys.items() if len(v) > 1}
    assert not clashes, clashes  # one key never stands for two of Triton's specialisations
    assert _launch.binder(())(()) == ((), ())


def test_other_objects_key_on_themselves_and_unhashable_ones_on_nothing_reusable():
    assert _launch.spec("a") == (str, "a") != _launch.spec("b")
    assert _launch.spec([1]) != _launch.spec([1])


def _body(x_ptr, y_ptr, n, eps, BLOCK: tl.constexpr, FLAG: tl.constexpr):
    pass


def _constexpr_first(BLOCK: tl.constexpr, x_ptr, n):
    pass


class _Compiled:
    """Stands in for a CompiledKernel: records each direct launch."""

    def __init__(self, launches):
        self.function, self.packed_metadata, self.launches = "function", "metadata", launches

    def run(self, *call):
        self.launches.append(call)


class _Kernel(JITFunction):
    """A @triton.jit kernel whose own launch (kernel[grid]) records the call and 'compiles' per Triton's key."""

    def __init__(self, fn=_body):
        super().__init__(fn)
        self.plain, self.direct, self.variants = [], [], {}

    def __getitem__(self, grid):  # (Triton's own run stays the class's: a wrapped one is tested below)
        return lambda *args, **kwargs: self._launch(args, grid=grid, **kwargs)

    def _launch(self, args, grid, **kwargs):
        self.plain.append((grid, args, kwargs))
        key = (tuple(native_specialize_impl(BaseBackend, a, False, True, True) if native_specialize_impl else
                     _launch.spec(a) for a in args), tuple(sorted(kwargs.items())))
        return self.variants.setdefault(key, _Compiled(self.direct))


def _launcher(kernel):
    launcher = _launch.Launcher(kernel)
    launcher._device, launcher._stream = (lambda: 0), (lambda device: 1234)
    return launcher


META = dict(BLOCK=64, FLAG=True, num_warps=4)


def test_a_repeated_call_goes_straight_to_the_compiled_kernel():
    kernel = _Kernel()
    launcher = _launcher(kernel)
    x, y = torch.zeros(64), torch.zeros(64)
    launcher.launch((3,), (x, y, 64, 1e-5), META)
    assert len(kernel.plain) == 1 and not kernel.direct
    launcher.launch((3,), (x, y, 64, 1e-5), META)
    launcher((5, 2), (x, y, 64, 1e-5), dict(BLOCK=64, FLAG=True), num_warps=4)
    assert len(kernel.plain) == 1
    # grid padded to 3-D, the stream, the kernel and its metadata, no launch hooks, then every argument in order
    assert kernel.direct == [(3, 1, 1, 1234, "function", "metadata", None, None, None, x, y, 64, 1e-5, 64, True),
                             (5, 2, 1, 1234, "function", "metadata", None, None, None, x, y, 64, 1e-5, 64, True)]


@pytest.mark.parametrize("change", ["alignment", "dtype", "int divisibility", "int is 1", "int width", "constexpr",
                                    "num_warps", "device", "float for int"])
def test_calls_that_specialise_differently_get_different_keys(change):
    kernel = _Kernel()
    launcher = _launcher(kernel)
    x, y = torch.zeros(80), torch.zeros(80)
    args, meta = (x, y, 64, 1e-5), dict(META)
    other = {"alignment": (x[1:], y, 64, 1e-5), "dtype": (x.to(torch.bfloat16), y, 64, 1e-5),
             "int divisibility": (x, y, 65, 1e-5), "int is 1": (x, y, 1, 1e-5), "int width": (x, y, 2**32, 1e-5),
             "float for int": (x, y, 64.0, 1e-5)}.get(change, args)
    other_meta = {"constexpr": dict(META, BLOCK=128), "num_warps": dict(META, num_warps=8)}.get(change, meta)
    launcher.launch((1,), args, meta)
    if change == "device":
        launcher._device = lambda: 1
    launcher.launch((1,), other, other_meta)
    assert len(launcher.compiled) == 2 and len(kernel.plain) == 2 and not kernel.direct
    launcher.launch((1,), other, other_meta)  # now known: straight to its own compiled kernel
    assert len(kernel.plain) == 2 and len(kernel.direct) == 1
    assert kernel.direct[0][9:] == (*other, other_meta.get("BLOCK"), True)
    # the 16-byte-aligned view of the same buffer shares the aligned key
    if change == "alignment":
        launcher.launch((1,), (x[4:], y, 64, 1e-5), meta)
        assert len(launcher.compiled) == 2 and len(kernel.plain) == 2


def test_switched_off_every_launch_is_tritons(monkeypatch):
    kernel = _Kernel()
    launcher = _launcher(kernel)
    monkeypatch.setattr(_launch, "ENABLED", False)
    for _ in range(3):
        launcher.launch((1,), (torch.zeros(4), torch.zeros(4), 4, 1.0), META)
    assert len(kernel.plain) == 3 and not kernel.direct and not launcher.compiled


def test_under_torch_compile_tracing_every_launch_is_tritons(monkeypatch):
    kernel = _Kernel()  # (Dynamo turns kernel[grid] into a node of its graph; a direct launch it could not trace)
    launcher = _launcher(kernel)
    monkeypatch.setattr(_launch, "_compiling", lambda: True)
    for _ in range(2):
        launcher.launch((1,), (torch.zeros(4), torch.zeros(4), 4, 1.0), META)
    assert len(kernel.plain) == 2 and not kernel.direct and not launcher.compiled


def test_launch_hooks_and_debug_take_tritons_path(monkeypatch):
    kernel = _Kernel()
    launcher = _launcher(kernel)
    args = (torch.zeros(4), torch.zeros(4), 4, 1.0)
    launcher.launch((1,), args, META)
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        launcher.launch((1,), args, META)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    monkeypatch.setattr(knobs.runtime, "debug", True)
    launcher.launch((1,), args, META)
    assert len(kernel.plain) == 3 and not kernel.direct
    monkeypatch.setattr(knobs.runtime, "debug", False)
    launcher.launch((1,), args, META)
    assert len(kernel.plain) == 3 and len(kernel.direct) == 1


def test_a_wrapped_run_sees_every_launch():
    # labkit.exercises.launches (and profilers) wrap JITFunction.run to see launches: then Triton's path, always
    class Recorded(_Kernel):
        pass
    kernel = Recorded()
    launcher = _launcher(kernel)
    args = (torch.zeros(4), torch.zeros(4), 4, 1.0)
    launcher.launch((1,), args, META)
    launcher.launch((1,), args, META)
    assert len(kernel.plain) == 1 and len(kernel.direct) == 1
    Recorded.run = lambda self, *a, **k: JITFunction.run(self, *a, **k)
    launcher.launch((1,), args, META)
    assert len(kernel.plain) == 2 and len(kernel.direct) == 1
    del Recorded.run
    launcher.launch((1,), args, META)
    assert len(kernel.plain) == 2 and len(kernel.direct) == 2


def test_the_exercises_recorder_sees_labkits_launches_while_it_records_and_only_then(monkeypatch):
    """labkit.exercises.launches wraps JITFunction.run for good (before student code runs): labkit's launches still
    go straight to the compiled kernel, except inside record(), where the recorder must see each one."""
    from labkit import compat
    from labkit.exercises import launches

    for cls in compat.launch_classes():  # whatever install() wraps is put back after this test
        monkeypatch.setattr(cls, "run", cls.run)
    monkeypatch.setattr(launches, "_installed", False)
    launches.install()
    kernel = _Kernel()
    launcher = _launcher(kernel)
    args = (torch.zeros(4), torch.zeros(4), 4, 1.0)
    launcher.launch((1,), args, META)
    launcher.launch((1,), args, META)
    assert len(kernel.plain) == 1 and len(kernel.direct) == 1  # installed, not recording: direct
    with launches.record():
        launcher.launch((1,), args, META)
    assert len(kernel.plain) == 2 and len(kernel.direct) == 1  # recording: Triton's path, through the wrapper
    launcher.launch((1,), args, META)
    assert len(kernel.plain) == 2 and len(kernel.direct) == 2


def test_a_launcher_that_takes_other_arguments_falls_back_for_good():
    kernel = _Kernel()
    launcher = _launcher(kernel)
    args = (torch.zeros(4), torch.zeros(4), 4, 1.0)
    launcher.launch((1,), args, META)

    def refuses(*call):
        raise TypeError("launch() takes other arguments")
    next(iter(kernel.variants.values())).run = refuses
    launcher.compiled = {k: (refuses, *v[1:]) for k, v in launcher.compiled.items()}
    launcher.launch((1,), args, META)
    assert launcher.disabled and not launcher.compiled and len(kernel.plain) == 2  # launched once, by Triton
    launcher.launch((1,), args, META)
    assert len(kernel.plain) == 3


def test_a_changed_global_goes_to_triton_which_reports_it():
    kernel = _Kernel()
    scope = {"SCALE": 2}
    kernel.used_global_vals = {("SCALE", id(scope)): (2, scope)}
    launcher = _launcher(kernel)
    args = (torch.zeros(4), torch.zeros(4), 4, 1.0)
    launcher.launch((1,), args, META)
    launcher.launch((1,), args, META)
    assert len(kernel.direct) == 1
    scope["SCALE"] = 3
    launcher.launch((1,), args, META)
    assert len(kernel.plain) == 2 and len(kernel.direct) == 1


def test_kernels_it_cannot_launch_directly_keep_tritons_path():
    hooked = _Kernel()
    hooked.add_pre_run_hook(lambda *a, **k: None)
    launcher = _launcher(hooked)
    for _ in range(2):
        launcher.launch((1,), (torch.zeros(4), torch.zeros(4), 4, 1.0), META)
    assert launcher.disabled and len(hooked.plain) == 2
    first = _Kernel(_constexpr_first)  # constexprs must come last to be passed after the arguments
    launcher = _launcher(first)
    for _ in range(2):
        launcher.launch((1,), (torch.zeros(4), 4), dict(BLOCK=16))
    assert not launcher.compiled and len(first.plain) == 2
    default = _Kernel()  # a constexpr left at its default: not in meta
    launcher = _launcher(default)
    for _ in range(2):
        launcher.launch((1,), (torch.zeros(4), torch.zeros(4), 4, 1.0), dict(BLOCK=16))
    assert not launcher.compiled and len(default.plain) == 2


class _Meta:
    num_warps, shared, num_ctas, launch_cooperative_grid, launch_pdl = 4, 1024, 1, False, False
    global_scratch_size = profile_scratch_size = 0


class _Src:
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "eps": "fp32", "BLOCK": "constexpr",
                 "FLAG": "constexpr"}


def _static_compiled(kernel):
    """Make the stand-in compiled kernels look like Triton's: a kernel handle, metadata and the signature."""
    real = kernel._launch

    def launch(args, grid, **kwargs):
        compiled = real(args, grid, **kwargs)
        compiled.function, compiled.metadata, compiled.src = 77, _Meta(), _Src()
        return compiled
    kernel._launch = launch


def test_with_pytorchs_static_launcher_pointers_go_as_integers_and_constexprs_stay_out(monkeypatch):
    calls = []
    monkeypatch.setattr(_launch, "_static_launch", lambda *call: calls.append(call))
    kernel = _Kernel()
    _static_compiled(kernel)
    launcher = _launcher(kernel)
    x, y = torch.zeros(64), torch.zeros(64)
    for grid in ((3,), (3,), (5, 2)):
        launcher.launch(grid, (x, y, 64, 1e-5), META)
    assert len(kernel.plain) == 1 and not kernel.direct
    # handle, grid, warps, shared memory, codes (two scratch pointers appended), arguments, stream
    assert calls == [(77, g, h, 1, 4, 1024, "OOifOO", (x.data_ptr(), y.data_ptr(), 64, 1e-5, None, None), 1234)
                     for g, h in ((3, 1), (5, 2))]
    # an integer of 1 is a constexpr in Triton's signature: left out of what is launched
    _Src.signature = dict(_Src.signature, n="constexpr")
    try:
        launcher.launch((1,), (x, y, 1, 1e-5), META)
        launcher.launch((1,), (x, y, 1, 1e-5), META)
    finally:
        _Src.signature = dict(_Src.signature, n="i32")
    assert calls[-1][6:8] == ("OOfOO", (x.data_ptr(), y.data_ptr(), 1e-5, None, None))


@pytest.mark.parametrize("change", ["no static launcher", "num_ctas", "cooperative", "pdl", "scratch",
                                    "unknown type"])
def test_what_the_static_launcher_cannot_do_goes_through_tritons_launcher(monkeypatch, change):
    calls = []
    monkeypatch.setattr(_launch, "_static_launch", None if change == "no static launcher" else
                        lambda *call: calls.append(call))
    meta = {"num_ctas": dict(num_ctas=2), "cooperative": dict(launch_cooperative_grid=True),
            "pdl": dict(launch_pdl=True), "scratch": dict(global_scratch_size=128)}.get(change, {})
    monkeypatch.setattr(_Meta, "__init__", lambda self: self.__dict__.update(meta))
    kernel = _Kernel()
    _static_compiled(kernel)
    launcher = _launcher(kernel)
    if change == "unknown type":
        monkeypatch.setattr(_Src, "signature", dict(_Src.signature, eps="nvTmaDesc"))
    x, y = torch.zeros(64), torch.zeros(64)
    for _ in range(2):
        launcher.launch((3,), (x, y, 64, 1e-5), META)
    assert not calls and len(kernel.plain) == 1 and len(kernel.direct) == 1


def test_a_cpu_tensor_never_reuses_a_gpu_launch():
    """The static launcher takes pointers as integers and cannot tell a CPU tensor's: a call with one has a key of
    its own (whether every tensor is on a GPU is part of it), so Triton's launch sees it, and refuses it."""
    key, _ = _launch.binder((torch.Tensor, torch.Tensor))((torch.zeros(4), torch.zeros(4)))
    assert key[-2] is False


def test_labkits_kernels_launch_through_it_and_interpreted_ones_plainly():
    _common, bias_gelu, layer_norm, softmax, vector_add = (importlib.import_module(f"labkit.kernels.{m}") for m in (
        "_common", "bias_gelu", "layer_norm", "softmax", "vector_add"))
    launchers = [layer_norm._fwd, layer_norm._bwd, layer_norm._bwd_split, softmax._one_pass, softmax._split,
                 bias_gelu._fwd, bias_gelu._bwd, vector_add._launch, _common._sum_partials]
    assert all(isinstance(la, _launch.Launcher) for la in launchers)
    # interpreted: Triton's path; on a GPU none gave up on the direct launch (after the kernel tests, in 39h.sh)
    assert [la.disabled for la in launchers] == [INTERPRETED] * len(launchers)
