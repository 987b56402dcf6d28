"""labkit.grading.answers: labkit objects that answer an exercise are stubs while that exercise is graded
(in a subprocess: installing the stubs changes labkit's modules for the rest of the process)."""
import subprocess
import sys
import textwrap
from pathlib import Path

from labkit import exercises
from labkit.paths import child_env

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import pytest
    from labkit.serving import batchsim, batcher
    from labkit.grading import answers
    from labkit.parallel import pipeline
    from labkit.capstone import train

    answers.install({"labkit.serving.batcher.launch_delay": {"launch_delay": "12_serving"},
                     "labkit.parallel.pipeline.order_1f1b": {"one_f_one_b": "10_model_parallel"},
                     "labkit.capstone.train.Trainer": {"make_trainer": "13_capstone"}})
    from labkit.serving.batcher import launch_delay  # what a student's cell gets
    assert launch_delay is batcher.launch_delay is batchsim.launch_delay
    assert pipeline.ORDERS["1f1b"] is pipeline.order_1f1b  # dict values too
    assert launch_delay(8, 0.0, 8, 1e-3) == 0.0  # outside grading: labkit's own, for the notebook's cells
    assert pipeline.ORDERS["1f1b"](0, 2, 3)[0] == ("F", 0)
    with answers.grading("one_f_one_b"):  # another exercise graded: launch_delay works
        assert launch_delay(1, 0.0, 8, 1e-3) > 0
        with pytest.raises(RuntimeError, match="order_1f1b is what exercise 10_model_parallel asks you to write"):
            pipeline.ORDERS["1f1b"](0, 2, 3)
    with answers.grading("launch_delay"):
        with pytest.raises(RuntimeError, match="while your `launch_delay` is graded"):
            launch_delay(8, 0.0, 8, 1e-3)
    assert train.Trainer.step is not None  # attributes too: labkit's own outside grading
    with answers.grading("make_trainer"), pytest.raises(RuntimeError, match="13_capstone asks you to write"):
        train.Trainer.step
    with pytest.raises(TypeError, match="does not let you subclass"):
        class Mine(train.Trainer):
            pass
    print("ok")
""")


def test_stubs_refuse_only_while_their_function_is_graded():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=child_env(ROOT),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_every_declared_answer_exists():
    from labkit.grading.answers import _resolve
    for fn in exercises.functions().values():
        for dotted in fn.answers:
            assert _resolve(dotted)[0] is not None, dotted


def test_the_sandboxs_labkit_copy_has_no_answer_in_source_or_bytecode(tmp_path):
    """What the grading sandbox mounts as labkit (labkit.grading.strip): every declared answer (and a private
    helper only answers used) is a raise, a reload or the source file gives nothing more, the rest imports."""
    from labkit.grading.strip import stripped_copy

    owned = {d: nb for nb, fns in exercises.by_notebook().items() for fn in fns for d in fn.answers}
    copy = stripped_copy(owned, tmp_path)
    assert not list(copy.rglob("__pycache__")) and not list(copy.rglob("*.pyc"))
    schedule = (copy / "parallel" / "schedule.py").read_text()
    real = (ROOT / "labkit" / "parallel" / "schedule.py").read_text()
    assert "warm" in real.split("def order_1f1b")[1].split("\ndef ")[0]
    assert "warm" not in schedule.split("def order_1f1b")[1].split("\ndef ")[0]  # its body is gone
    kernel = (copy / "kernels" / "attention.py").read_text()
    assert "exp2" not in kernel.split("def _fwd_tiles")[1].split("\ndef ")[0]  # the online softmax, only it used
    script = textwrap.dedent("""
        import importlib, inspect, pkgutil, labkit
        from labkit.parallel import pipeline
        from labkit.serving import batcher
        from labkit.capstone import train, ddp
        for m in pkgutil.walk_packages(labkit.__path__, 'labkit.'):
            if not m.name.endswith('__main__'):
                importlib.import_module(m.name)
        for f in (lambda: importlib.reload(pipeline).order_1f1b(0, 2, 3), lambda: batcher.launch_delay(1, 0, 8, 1e-3),
                  lambda: importlib.reload(importlib.import_module('labkit.parallel.schedule')).order_1f1b(0, 2, 3),
                  lambda: train.Trainer(None, None, None, None), lambda: ddp.DDPTrainer(rank=0, world=1)):
            try:
                f()
            except RuntimeError as exc:
                assert "copy of labkit does not have it" in str(exc), exc
            else:
                raise AssertionError("an answer ran")
        assert 'warm' not in inspect.getsource(pipeline.order_1f1b)
        assert pipeline.order_gpipe(0, 2, 3)  # what is not an answer still works
        print(labkit.__file__)
    """)
    env = child_env(ROOT)
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == str(copy / "__init__.py"), done.stdout + done.stderr
