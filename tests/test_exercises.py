"""exercises/ is generated from solutions/, stays in step with it, and the student checks say what is wrong."""
import functools
import json
import linecache
import re
import shutil
from pathlib import Path

import pytest
import torch

from conftest import committed_text
from fake_clock import FakeClock
from labkit import check
from labkit.exercises import ex03_timing, ex11_profiling, ex13_capstone
from labkit.exercises import notebooks as exercises

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"
GRADED_FUNCTIONS = ["causal_mask", "to_device", "pinned_copy", "overlapped_map", "median_ms", "matmul_flops_bytes",
                    "attainable_tflops", "row_sum", "found_inf", "update_scale", "average_gradients",
                    "accumulated_grads", "flash_attention", "one_f_one_b", "fast_train", "launch_delay", "make_trainer",
                    "update_cache", "decode_step"]


RELEASED_AS_BASELINE = {"make_trainer"}  # exercise 13 starts from the baseline training loop, which runs

# What the timed code "takes" on the graders' fake clock (speed is the benchmarks' and the notebooks' to measure):
SLOW_TRAIN_S, FAST_TRAIN_S = 0.010, 0.001  # exercise 11: a solution 10x faster than slow_train
BASELINE_ROUND_S, MY_ROUND_S = 1.0, 0.5  # exercise 13: a loop twice as fast as the baseline


def takes(fn, seconds: float, clock: FakeClock):
    """`fn`, moving `clock` on by `seconds` per call: the time it takes, as far as the grader can tell."""
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            clock.advance(seconds)
    return timed


def on_controlled_clock(name: str, monkeypatch):
    """For a timed exercise, its grader's clock made fake and the grader's own reference taking a set time; returns
    `wrap(fn, seconds=...)` for the student's function (as it is, for an exercise that times nothing)."""
    clock = FakeClock()
    if name == "fast_train":
        monkeypatch.setattr(ex11_profiling, "_CLOCK", clock.perf_counter)
        monkeypatch.setattr(ex11_profiling, "slow_train", takes(ex11_profiling.slow_train, SLOW_TRAIN_S, clock))
        return lambda fn, seconds=FAST_TRAIN_S: takes(fn, seconds, clock)
    if name == "make_trainer":
        monkeypatch.setattr(ex13_capstone, "_CLOCK", clock.perf_counter)
        monkeypatch.setattr(ex13_capstone, "BaselineTrainer",
                            takes(ex13_capstone.BaselineTrainer, BASELINE_ROUND_S, clock))
        return lambda fn, seconds=MY_ROUND_S: takes(fn, seconds, clock)
    if name == "median_ms":  # the grader's sleeps and the student's perf_counter, on one clock: durations exact
        monkeypatch.setattr(ex03_timing, "time", clock)
        monkeypatch.setattr(ex03_timing, "_PERF", clock.perf_counter)
        monkeypatch.setattr(ex03_timing, "_NAP", clock.sleep)

        def on_clock(fn):
            fn.__globals__["time"] = clock  # (the namespace functions_from made for this notebook alone)
            return fn
        return on_clock
    return lambda fn: fn


def test_every_cpu_graded_function_is_checked_here():
    """A new exercise's functions join the list above (the CUDA one has its own tests)."""
    from labkit import exercises as registry
    assert set(registry.functions()) - {"scale_kernel_source"} == set(GRADED_FUNCTIONS)


def code_of(nb: dict) -> list[str]:
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in nb["cells"] if c["cell_type"] == "code"]


def functions_from(path: Path) -> dict:
    """Run only the cells of a notebook that define functions (imports included), as a student's kernel would."""
    ns: dict = {"__name__": "__main__"}  # as in a notebook: compiled Triton reads each jit function's __module__
    exec("import statistics, time\nimport torch\nimport torch.nn.functional as F\nimport triton\n"
         "import triton.language as tl\nimport labkit\nfrom labkit import check", ns)
    for i, src in enumerate(code_of(json.loads(path.read_text()))):
        if re.search(r"^(@triton\.jit\n)?(def|class) ", src, re.M):
            name = f"<{path.parent.name}/{path.stem} cell {i}>"
            linecache.cache[name] = (len(src), None, src.splitlines(True), name)  # Triton reads kernels' source
            exec(compile(src, name, "exec"), ns)
    return ns


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """solutions/ and exercises/ as git's index holds them: a student who works in exercises/ (edits, saved
    outputs) changes their own copy, not what these tests check."""
    root = tmp_path_factory.mktemp("committed")
    for folder in (SOLUTIONS, EXERCISES):
        (root / folder.name).mkdir()
        for nb in folder.glob("*.ipynb"):
            (root / folder.name / nb.name).write_text(committed_text(nb))
    return root / SOLUTIONS.name, root / EXERCISES.name


def test_exercises_are_up_to_date_with_solutions(committed):
    solutions, released = committed
    assert exercises.stale(solutions, released, root=solutions.parent) == [], "run `labkit exercises build`"


def test_every_solution_notebook_has_a_generated_exercise_without_its_answers(committed):
    solutions, released = committed
    sources = exercises.solution_notebooks(solutions)
    assert len(sources) >= 8
    for src in sources:
        ex = json.loads((released / src.name).read_text())
        meta = ex["metadata"]["labkit"]
        assert meta["generated_from"] == f"solutions/{src.name}" and meta["exercise"] == src.stem
        assert not exercises.hand_edited(released / src.name)
        text = "\n".join(code_of(ex))
        assert "SOLUTION" not in text and "NotImplementedError" in text
        for cell in code_of(ex):
            compile(cell, src.name, "exec")  # still valid Python
        # every non-comment line inside a solution region is gone
        for cell in code_of(json.loads(src.read_text())):
            for region in re.findall(r"# BEGIN SOLUTION\n(.*?)# END SOLUTION", cell, re.S):
                for line in region.splitlines():
                    if line.strip() and not line.strip().startswith("#") and len(line.strip()) > 12:
                        assert line not in text.splitlines(), f"{src.name}: {line.strip()!r} leaked"


def test_stub_keeps_indentation_and_uses_the_hint():
    src = ("def f(x):\n    y = 1\n    if x:\n        # BEGIN SOLUTION\n        # HINT: return y + x\n"
           "        return y + x\n        # END SOLUTION\n    return y\n")
    out = exercises.stub_source(src)
    assert out == 'def f(x):\n    y = 1\n    if x:\n        raise NotImplementedError("return y + x")\n    return y\n'
    ns: dict = {}
    exec(out, ns)
    with pytest.raises(NotImplementedError, match="return y"):
        ns["f"](1)
    assert ns["f"](0) == 1
    assert ('NotImplementedError("write this part")'
            in exercises.stub_source("# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n"))


@pytest.mark.parametrize("bad, why", [("# BEGIN SOLUTION\nx = 1\n", "never closed"),
                                      ("x = 1\n# END SOLUTION\n", "without a BEGIN"),
                                      ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "inside another")])
def test_broken_markers_are_reported_with_their_line(bad, why):
    with pytest.raises(exercises.MarkerError, match=why):
        exercises.stub_source(bad, "nb.ipynb, cell 3")


def test_build_refuses_to_overwrite_hand_edits_and_check_sees_stale_exercises(tmp_path, capsys):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    shutil.copy(SOLUTIONS / "04_roofline.ipynb", sol)
    assert exercises.build(sol, ex) == 0
    first = (ex / "04_roofline.ipynb").read_text()
    assert exercises.build(sol, ex) == 0 and (ex / "04_roofline.ipynb").read_text() == first  # stable output
    assert exercises.stale(sol, ex) == []

    # the instructor edits the source: check notices, build regenerates
    nb = json.loads((sol / "04_roofline.ipynb").read_text())
    nb["cells"][0]["source"] = "# Exercise 04, revised\n"
    (sol / "04_roofline.ipynb").write_text(json.dumps(nb))
    assert any("out of date" in p for p in exercises.stale(sol, ex))
    assert exercises.build(sol, ex) == 0 and exercises.stale(sol, ex) == []

    # someone edits the generated notebook by hand: build refuses, --force overwrites
    edited = json.loads((ex / "04_roofline.ipynb").read_text())
    edited["cells"][2]["source"] = "quick = True  # my local change\n"
    (ex / "04_roofline.ipynb").write_text(json.dumps(edited))
    assert any("edited by hand" in p for p in exercises.stale(sol, ex))
    assert exercises.build(sol, ex) == 1
    assert "my local change" in (ex / "04_roofline.ipynb").read_text()
    assert "--force" in capsys.readouterr().err
    assert exercises.build(sol, ex, force=True) == 0 and exercises.stale(sol, ex) == []


@pytest.mark.parametrize("name", GRADED_FUNCTIONS)
def test_solutions_pass_their_visible_checks_and_exercises_say_not_done(name, capsys, monkeypatch):
    timed = on_controlled_clock(name, monkeypatch)  # before the notebooks' cells run: they import from labkit
    nb = next(p for p in exercises.solution_notebooks(SOLUTIONS) if f"def {name}(" in p.read_text())
    assert check.run_check(name, timed(functions_from(nb)[name])) is True
    assert "✓" in capsys.readouterr().out
    if name in RELEASED_AS_BASELINE:  # a working loop from the start: the grader gives it the baseline's points
        assert check.run_check(name, timed(functions_from(EXERCISES / nb.name)[name])) is True
        return
    assert check.run_check(name, timed(functions_from(EXERCISES / nb.name)[name])) is False
    out = capsys.readouterr().out
    assert "not done yet:" in out and "Traceback" not in out


def test_cuda_check_needs_a_gpu_in_one_line(capsys):
    ns = functions_from(SOLUTIONS / "06_cuda_kernel.ipynb")
    ok = check.scale_kernel_source(ns["scale_kernel_source"])
    out = capsys.readouterr().out
    if not check.have_cuda_toolchain():
        assert ok is False and out.count("\n") == 1 and "needs a GPU and nvcc" in out
    assert check.scale_kernel_source(lambda: 42) is False
    assert "expected a string of CUDA C" in capsys.readouterr().out


def test_check_reports_wrong_shape_dtype_device_and_values(capsys):
    def wrong_shape(x):
        t = x.shape[-2]
        return torch.ones(t, t, dtype=torch.bool, device=x.device).tril()[None]

    def wrong_dtype(x):
        t = x.shape[-2]
        return torch.ones(t, t, device=x.device).tril()

    def wrong_values(x):
        t = x.shape[-2]
        return torch.ones(t, t, dtype=torch.bool, device=x.device).triu()

    def raises(x):
        raise ValueError("bad input")

    for fn, expect in [(wrong_shape, "wrong shape: expected (5, 5), got (1, 5, 5)"),
                       (wrong_dtype, "wrong dtype: expected torch.bool, got torch.float32"),
                       (wrong_values, "20 of 25 elements differ; first ones: [0, 1]: expected False, got True"),
                       (raises, "raised ValueError: bad input (in raises, line")]:
        assert check.causal_mask(fn) is False
        assert expect in capsys.readouterr().out

    def on_cpu(x):
        t = x.shape[-2]
        return torch.ones(t, t, dtype=torch.bool).tril()

    if labkit_device_is_cpu():
        assert check.causal_mask(on_cpu) is False
        assert "wrong device: expected meta, got cpu" in capsys.readouterr().out
    assert check.causal_mask("not a function") is False


def labkit_device_is_cpu() -> bool:
    import labkit
    return labkit.current().device.type == "cpu"


def test_compare_lists_indices_and_values_of_differing_elements():
    exp = check.expect_tensor(torch.arange(12.0).reshape(3, 4), "cpu")
    got = check.snapshot(torch.arange(12.0).reshape(3, 4).index_put_((torch.tensor([2]), torch.tensor([3])),
                                                                   torch.tensor(float("nan"))))
    (msg,) = check.compare(exp, got, rtol=1e-6, atol=1e-6)
    assert "1 of 12 elements differ" in msg and "[2, 3]: expected 11, got nan" in msg
    assert check.compare({"a": 1.0}, {"a": 1.0 + 1e-12}, rtol=1e-9) == []
    assert "expected a tuple, got a list" in check.compare((1, 2), [1, 2])[0]
    assert "expected True" in check.compare(True, 1)[0]


def test_attention_check_needs_the_notebooks_own_triton_kernel(capsys, tmp_path):
    import torch.nn.functional as F

    from labkit import kernels
    from labkit.exercises.ex09_attention import RAN_OWN_KERNEL

    def sdpa(q, k, v, causal):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def labkits(q, k, v, causal):
        return kernels.attention(q, k, v, causal=causal)

    for fn in (sdpa, labkits):  # right values, but not a kernel of the notebook's
        assert check.flash_attention(fn) is False
        out = capsys.readouterr().out
        assert f"{RAN_OWN_KERNEL}: expected True, got False" in out and "Traceback" not in out
    wrong = functions_from_edited(SOLUTIONS / "09_attention.ipynb", "acc * alpha[:, None]", "acc", tmp_path)
    assert check.flash_attention(wrong["flash_attention"]) is False
    assert "elements differ" in capsys.readouterr().out


def test_profiling_check_measures_the_speed_up_and_the_results(capsys, monkeypatch):
    slow_train = ex11_profiling.slow_train
    timed = on_controlled_clock("fast_train", monkeypatch)
    assert check.fast_train(timed(slow_train, SLOW_TRAIN_S)) is False  # right results, no faster
    out = capsys.readouterr().out
    assert "speed-up: 1.00x, measured by the grader" in out and "at least 2x is needed" in out
    fast = functions_from(SOLUTIONS / "11_profiling.ipynb")["fast_train"]
    assert check.fast_train(timed(fast, SLOW_TRAIN_S / 1.5)) is False  # every fix made, but only 1.5x
    out = capsys.readouterr().out
    assert "speed-up: 1.50x" in out and "at least 2x is needed" in out and "clip:" not in out and "ops:" not in out
    assert check.fast_train(timed(fast, SLOW_TRAIN_S / 2.5)) is True  # 2.5x
    capsys.readouterr()
    unclipped = timed(lambda p, xs, ys, lr, momentum, max_norm: fast(p, xs, ys, lr, momentum, 1e9))
    assert check.fast_train(unclipped) is False
    assert "results[0][0]['w1']" in capsys.readouterr().out  # no clipping: other parameters, however fast


PARTLY_FIXED = {  # slow_train with some of the fixes the exercise asks for (each keeps the results right)
    "clip only": [("norm = math.sqrt(sum(e * e for g in grads for e in g.flatten().tolist()))",
                   "norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))")],
    "clip and sync": [("norm = math.sqrt(sum(e * e for g in grads for e in g.flatten().tolist()))\n"
                       "            scale = min(1.0, max_norm / (norm + 1e-6))",
                       "norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))\n"
                       "            scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)"),
                      ("losses.append(loss.item())", "losses.append(loss.detach())"),
                      ("torch.tensor(losses)", "torch.stack(losses).cpu()")],
}


@pytest.mark.parametrize("name", PARTLY_FIXED)
def test_profiling_grader_checks_every_fix_and_partly_fixed_code_loses_marks(name):
    import inspect

    from labkit.exercises import ex11_profiling
    from labkit.grading import specs

    src = inspect.getsource(ex11_profiling.slow_train).replace("def slow_train", "def fast_train")
    for old, new in PARTLY_FIXED[name]:
        assert old in src
        src = src.replace(old, new)
    ns = dict(vars(ex11_profiling))
    exec(src, ns)
    spec = specs.load_specs(SOLUTIONS / "graded")["11_profiling"][0]
    case = specs.make_cases(spec, specs.default_seed(SOLUTIONS / "graded"), False)[0]
    frac, problems, _ = spec.fn.score(case["expected"], spec.fn.call(ns["fast_train"], case["args"]))
    assert 0 < frac < 1, problems  # the results are right: some credit, never full marks
    assert any(p.startswith("copies:") for p in problems) and any(p.startswith("ops:") for p in problems)
    assert any(p.startswith("sync:") for p in problems) == (name == "clip only")
    assert not any(p.startswith("clip:") for p in problems)
    fast = functions_from(SOLUTIONS / "11_profiling.ipynb")["fast_train"]
    work = ex11_profiling.count_work(fast, ex11_profiling.make_problem(1, ex11_profiling.VISIBLE_SIZES), {})
    slow = ex11_profiling.count_work(ex11_profiling.slow_train,
                                     ex11_profiling.make_problem(1, ex11_profiling.VISIBLE_SIZES), {})
    assert not any(ex11_profiling.fixes(work, slow["ops"], ex11_profiling.VISIBLE_SIZES["steps"]).values())


def test_profiling_reference_is_slow_train_in_float64():
    """The grader's expected results come from reference_train: slow_train's arithmetic, its clip vectorised."""
    import torch

    from labkit.exercises import ex11_profiling as ex11

    sizes = {"steps": 5, "batch": 3, "d_in": 7, "hidden": 11, "d_out": 2}
    for seed, max_norm in ((4, 0.05), (5, 100.0)):  # the clip scales every step, and never
        problem = ex11.make_problem(seed, sizes, "cpu", torch.float64)
        want, got = ex11.slow_train(*problem, max_norm=max_norm), ex11.reference_train(*problem, max_norm=max_norm)
        for k in want[0]:
            torch.testing.assert_close(got[0][k], want[0][k], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got[1].float(), want[1], rtol=1e-6, atol=1e-7)


def test_profiling_call_that_notices_it_is_counted_cannot_skip_the_work():
    """A fast_train that does the work in timed calls but, when it sees the grader's counting modes, returns its
    last result without a single op earns nothing: the counted call's result is checked like the timed ones'."""
    import torch

    from labkit.grading import specs

    fast = functions_from(SOLUTIONS / "11_profiling.ipynb")["fast_train"]
    last = []

    def cheat(params, xs, ys, **hyper):
        if torch._C._is_torch_function_mode_enabled():  # counted: do nothing, hand back the last answer
            return last[-1]
        last.append(fast(params, xs, ys, **hyper))
        return last[-1]

    spec = specs.load_specs(SOLUTIONS / "graded")["11_profiling"][0]
    case = specs.make_cases(spec, specs.default_seed(SOLUTIONS / "graded"), False)[0]
    frac, problems, _ = spec.fn.score(case["expected"], spec.fn.call(cheat, case["args"]))
    assert frac == 0 and any("counted call" in p for p in problems), problems
    honest, problems, _ = spec.fn.score(case["expected"], spec.fn.call(fast, case["args"]))
    assert not any("counted call" in p for p in problems), problems  # the solution's counted call is right


def test_triton_stubs_read_as_not_done_yet():
    import ast

    from triton.compiler.errors import UnsupportedLanguageConstruct
    from triton.runtime.errors import InterpreterError

    from labkit.exercises.feedback import describe_error, not_done

    try:  # the interpreter wraps a kernel's exception
        try:
            raise NotImplementedError("the update")
        except NotImplementedError as inner:
            raise InterpreterError(repr(inner)) from inner
    except InterpreterError as exc:
        assert describe_error(exc) == "not done yet: the update" and not_done(exc)
    src = 'def k(x):\n    raise NotImplementedError("the update")\n'  # a GPU's compiler refuses the stub
    exc = UnsupportedLanguageConstruct(src, ast.parse(src).body[0].body[0], "unsupported AST node type: Raise")
    assert describe_error(exc) == "not done yet: the update" and not_done(exc)
    assert not not_done(UnsupportedLanguageConstruct(src, ast.parse("x = 1").body[0], "other"))


def functions_from_edited(path: Path, old: str, new: str, folder: Path, *more: tuple[str, str]) -> dict:
    """functions_from a copy of the notebook with `old` replaced by `new` in its code (and each further (old, new)
    pair in `more`)."""
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for a, b in [(old, new), *more]:
            src = src.replace(a, b)
        cell["source"] = src
    copy = folder / path.name
    copy.write_text(json.dumps(nb))
    return functions_from(copy)


# Past this many elements a row or sequence no longer fits one block of the sizes a kernel commonly fixes (64, 128):
# one that reads a single fixed block and never loops is wrong there (issue 40: row_sum with BLOCK=64 passed visible
# rows of at most 51 columns). One threshold, not a class per block size, to keep it simple; finer ones (over 16, 32
# or 64) would also ask flash_attention, update_cache and decode_step for longer visible inputs than they have now.
ONE_BLOCK = 128


def _input_classes(case: dict) -> set:
    """The classes of input a case exercises: each tensor argument's dtype, rank and whether some dimension is longer
    than ONE_BLOCK; its view or layout, causal or not; for micro-batches, whether micro_batch divides the batch."""
    out = set()
    args = case["args"]
    for k, v in args.items():
        if isinstance(v, torch.Tensor):
            out |= {(k, str(v.dtype).removeprefix("torch.")), (k, f"{v.dim()}-D")}
            if any(n > ONE_BLOCK for n in v.shape):
                out.add((k, f"a dimension over {ONE_BLOCK}"))
        elif k in ("view", "layout", "causal") and v is not None:
            out.add((k, v))
    if "micro_batch" in args:  # accumulated_grads: an uneven last micro-batch weighs less than the others
        divides = args["x"].shape[0] % args["micro_batch"] == 0
        out.add(("micro_batch", "divides the batch" if divides else "leaves a smaller last micro-batch"))
    return out


def test_every_visible_check_covers_the_classes_of_the_hidden_cases():
    """A ✓ from a notebook's check means the grader agrees on classes: the hidden cases (solutions/graded; the CPU
    plan, and the GPU plan where CUDA is) use no dtype, rank, view, layout, size past a block or uneven micro-batch
    the visible check lacks (issue 40: 05's check ran one contiguous case, then rows of at most 51 columns)."""
    from labkit.grading.specs import default_seed, load_specs, make_cases

    graded = SOLUTIONS / "graded"
    missing = {}
    for specs in load_specs(graded).values():
        for s in specs:
            if s.fn.visible is None:  # 06's CUDA source: built and run by the grader only (a GPU and nvcc)
                assert s.fn.needs_gpu and s.fn.stage is not None, s.name
                continue
            visible = set().union(*map(_input_classes, s.fn.visible()))
            for gpu in {False, torch.cuda.is_available()}:  # the GPU plan where it can be made
                hidden = set().union(*map(_input_classes, make_cases(s, default_seed(graded), gpu)))
                if hidden - visible:
                    missing[(s.name, gpu)] = sorted(hidden - visible, key=str)
    assert not missing, missing


def test_row_sum_check_catches_ignored_strides_and_a_launch_on_a_scratch_buffer(capsys, tmp_path):
    from labkit.exercises.ex05_triton_row_sum import LAUNCHED

    path = SOLUTIONS / "05_triton_row_sum.ipynb"
    assert check.row_sum(functions_from(path)["row_sum"]) is True
    capsys.readouterr()
    no_stride = functions_from_edited(path, "cols * stride_col", "cols", tmp_path)  # issue 40's kernel
    assert check.row_sum(no_stride["row_sum"]) is False
    assert "elements differ" in capsys.readouterr().out
    (tmp_path / "s").mkdir()
    scratch = functions_from_edited(path, "row_sum_kernel[(rows,)](x, out,", "row_sum_kernel[(rows,)](x, x.new_empty("
                                    "rows, dtype=torch.float32),", tmp_path / "s")
    assert "x.new_empty(" in (tmp_path / "s" / path.name).read_text()
    assert check.row_sum(lambda x: scratch["row_sum"](x).copy_(x.float().sum(1))) is False  # library's result
    assert f"{LAUNCHED}: expected True, got False" in capsys.readouterr().out


# Issue 40's audit: wrong answers that passed the visible checks and failed hidden cases (the released solution with
# one mistake). Each (old, new) edit; then what the check's output names: the case that catches it.
WRONG_BEYOND_THE_OLD_VISIBLE_CASES = {
    "causal_mask": ("01_device_placement", [("t = x.shape[-2]", "t = x.shape[1]")], "x of shape (4, 6)"),
    "row_sum": ("05_triton_row_sum", [("block = min(1024, max(16, triton.next_power_of_2(cols)))", "block = 64"),
                                      ("range(0, n_cols, BLOCK):", "range(0, BLOCK, BLOCK):")],  # one block, no loop
                "x: contiguous of shape (3, 200)"),
    "accumulated_grads": ("08_data_parallel", [("* (xs.shape[0] / x.shape[0])", "/ -(-x.shape[0] // micro_batch)")],
                          "a batch of 11 in micro-batches of 4"),
}


@pytest.mark.parametrize("name", sorted(WRONG_BEYOND_THE_OLD_VISIBLE_CASES))
def test_visible_checks_catch_a_wrong_rank_a_single_block_and_equal_micro_batch_weights(name, capsys, tmp_path):
    """causal_mask taking T from x.shape[1] (right for 3-D input only), row_sum summing one fixed block of 64 columns
    without a loop, accumulated_grads weighing each micro-batch's loss 1/n_micro (right when micro_batch divides the
    batch): each passed 3D-only, at-most-51-column, even-batch visible checks. The released solution still passes."""
    stem, edits, caught_by = WRONG_BEYOND_THE_OLD_VISIBLE_CASES[name]
    path = SOLUTIONS / f"{stem}.ipynb"
    assert check.run_check(name, functions_from(path)[name]) is True
    capsys.readouterr()
    text = "\n".join(code_of(json.loads(path.read_text())))
    assert all(old in text for old, _ in edits), "the solution changed: update the edits above"
    wrong = functions_from_edited(path, *edits[0], tmp_path, *edits[1:])[name]
    assert check.run_check(name, wrong) is False
    out = capsys.readouterr().out
    assert f"✗ {name}, on {caught_by}" in out and "Traceback" not in out, out


# --- Issue 40's audit, gap 7: hostile submissions for classes whose mechanism exists but had no test ---


class _Deferred:
    """Work put off until something reads its result: `thunk` runs once, on the first read."""

    def __init__(self, thunk):
        self.thunk, self.value = thunk, None

    def get(self):
        if self.value is None:
            self.value = self.thunk()
        return self.value


class _LazyTensor(torch.Tensor):
    """A tensor of the right shape and dtype whose values are computed only when a torch function first reads it
    (detach, to, clone: what copying it out does), by the deferred call; until then it holds nothing."""

    @staticmethod
    def __new__(cls, like: torch.Tensor, deferred: _Deferred, pick):
        t = torch.Tensor._make_subclass(cls, torch.empty_like(like))
        t._deferred, t._pick = deferred, pick
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def real(a):
            return a._pick(a._deferred.get()) if isinstance(a, _LazyTensor) else a
        args, kwargs = torch.utils._pytree.tree_map(real, (args, kwargs or {}))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def test_a_lazy_result_that_defers_its_work_until_read_is_timed_with_its_work(monkeypatch):
    """fast_train returning at once tensors that compute the training only when read (issue 40's lazy tensor): the
    grader copies the result out inside the timed region (ex11._timed), so the deferred work, as slow as slow_train,
    is timed, and the right results earn no speed-up."""
    fast = functions_from(SOLUTIONS / "11_profiling.ipynb")["fast_train"]
    timed = on_controlled_clock("fast_train", monkeypatch)
    clock = ex11_profiling._CLOCK.__self__
    returns_s = 1e-4  # the call itself returns at once

    def lazy(params, xs, ys, **hyper):
        def work():
            clock.advance(SLOW_TRAIN_S)  # what the deferred training takes: as long as slow_train
            return fast(params, xs, ys, **hyper)
        deferred = _Deferred(work)
        lazy_params = {k: _LazyTensor(p, deferred, lambda r, k=k: r[0][k]) for k, p in params.items()}
        return lazy_params, _LazyTensor(torch.empty(xs.shape[0]), deferred, lambda r: r[1])

    sizes = {"steps": 6, "batch": 4, "d_in": 8, "hidden": 16, "d_out": 2}
    case = ex11_profiling.fast_train_case("lazy", sizes, {"lr": 0.05, "momentum": 0.9, "max_norm": 1.0},
                                          list(range(300, 307)), "cpu")
    got = ex11_profiling.call_fast_train(timed(lazy, returns_s), case["args"])
    assert got["yours s"] == pytest.approx([returns_s + SLOW_TRAIN_S] * len(got["yours s"]))  # the work was timed
    frac, problems, _ = ex11_profiling.score_fast_train(case["expected"], got)
    assert not any(p.startswith("results") for p in problems), problems  # the values it computed are right
    assert any(re.match(r"speed-up: (0\.99|1\.00)x", p) for p in problems), problems  # no faster than slow_train
    assert frac < 1


def test_inputs_a_submission_zeroes_in_place_never_reach_the_expected_results():
    """update_cache that zeroes the new keys and values it is given, in place, then writes them: its caches equal the
    reference computed from its arguments after the call, but the grader's expected results were made from the seed
    before the call and are held apart (the child gets only the arguments): every hidden case fails, the expected
    results are those rebuilt from the seed, and the rebuilt inputs are the seed's, not the zeros."""
    from labkit.exercises import ex14_llm_inference as ex14
    from labkit.grading import specs

    graded = SOLUTIONS / "graded"
    spec = next(s for s in specs.load_specs(graded)["14_llm_inference"] if s.name == "update_cache")
    seed = specs.default_seed(graded)
    cases = specs.make_cases(spec, seed, False)

    def zeroes(cache_k, cache_v, k, v, pos):
        k.zero_()
        v.zero_()
        for b in range(k.shape[0]):
            p = int(pos[b])
            cache_k[b, :, p:p + k.shape[2]] = k[b]
            cache_v[b, :, p:p + v.shape[2]] = v[b]

    for case in cases:
        got = spec.fn.call(zeroes, case["args"])
        a = case["args"]
        assert not a["k"].any() and not a["v"].any()  # it reached the arguments it was given
        after = ex14.reference_update(a["cache_k"], a["cache_v"], a["k"].transpose(1, 2), a["v"].transpose(1, 2),
                                      a["pos"])  # the reference, were it computed from them after the call
        assert spec.fn.compare({"cache_k": check.expect_tensor(after[0], "cpu"),
                                "cache_v": check.expect_tensor(after[1], "cpu")}, got) == []
        assert spec.fn.compare(case["expected"], got, case.get("rtol", 0.0), case.get("atol", 0.0)), case["about"]
    for case, fresh in zip(cases, specs.make_cases(spec, seed, False)):
        assert check.compare(fresh["expected"], case["expected"]) == []
        assert fresh["args"]["k"].any() and fresh["args"]["v"].any()  # rebuilt from the seed, not the zeroed ones


def test_attention_without_the_running_max_fails_the_hidden_large_logit_cases(tmp_path):
    """The released kernel with no running max (every tile's exponentials taken against 0): right on the hidden
    cases of ordinary logits, wrong (overflow, NaN) on every hidden case of large logits (q times 30), which the CPU
    and the GPU plans both have, longer than one key tile. The solution passes them all."""
    from labkit.exercises import launches
    from labkit.grading import specs

    graded = SOLUTIONS / "graded"
    spec = specs.load_specs(graded)["09_attention"][0]
    seed = specs.default_seed(graded)
    for gpu, tile in ((False, 64), (True, 128)):
        large = [c for c in specs.make_cases(spec, seed, gpu) if "large logits" in c["about"]]
        n = [c["args"]["q"].shape[1 if c["args"]["layout"] == "bnhd" else 2] for c in large]  # tokens
        assert len(large) >= 2 and min(n) > tile, (gpu, n)
    path = SOLUTIONS / "09_attention.ipynb"
    update = "m_new = tl.maximum(m_i, tl.max(s, 1))"
    assert update in "\n".join(code_of(json.loads(path.read_text()))), "the solution changed: update the edit"
    no_max = functions_from_edited(path, update, "m_new = tl.zeros_like(m_i)", tmp_path)["flash_attention"]
    solution = functions_from(path)["flash_attention"]
    launches.install()  # the exercise's prepare hook, as in the grading child

    def wrong(fn, case):
        return spec.fn.compare(case["expected"], spec.fn.call(fn, case["args"]), case["rtol"], case["atol"])

    cases = specs.make_cases(spec, seed, False)
    failed = {c["about"] for c in cases if wrong(no_max, c)}
    assert failed == {c["about"] for c in cases if "large logits" in c["about"]}, failed
    assert not any(wrong(solution, c) for c in cases)


def test_the_hidden_pipeline_sizes_change_with_the_seed_and_a_table_of_the_visible_orders_fails():
    """one_f_one_b's hidden (p, m) pairs are drawn per seed: over the default seed and ten others no two seeds draw
    the same pairs and none is a visible pair, so a submission that looks the visible cases' orders up fails every
    hidden case, while the solution passes them."""
    from labkit.exercises import ex10_model_parallel as ex10
    from labkit.grading import specs

    graded = SOLUTIONS / "graded"
    spec = specs.load_specs(graded)["10_model_parallel"][0]
    table = {(c["args"]["p"], c["args"]["m"]): [[(step[0], int(step[1:])) for step in order.split()]
                                                 for order in c["expected"]["order of each stage"]]
             for c in ex10.visible_one_f_one_b()}

    def looked_up(stage, p, m):
        return table[(p, m)][stage]  # a KeyError for any pair the visible cases do not show

    def passes(fn, c):
        try:
            return not spec.fn.compare(c["expected"], spec.fn.call(fn, c["args"]), c["rtol"], c["atol"])
        except KeyError:
            return False

    solution = functions_from(SOLUTIONS / "10_model_parallel.ipynb")["one_f_one_b"]
    drawn = []
    for seed in [specs.default_seed(graded), *range(10)]:
        cases = specs.make_cases(spec, seed, False)
        pairs = [(c["args"]["p"], c["args"]["m"]) for c in cases]
        assert not set(pairs) & set(table), (seed, pairs)
        drawn.append(tuple(pairs))
        assert not any(passes(looked_up, c) for c in cases), seed
        if seed == specs.default_seed(graded):
            assert all(passes(solution, c) for c in cases)
    assert len(set(drawn)) == len(drawn), drawn
