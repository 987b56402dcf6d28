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
