"""labkit.grading.rounds: the parent times rounds from outside (on a CPU, each side's CPU time), passes over a reply
sent twice, serves a workload's calls, and stops every process of the student's between its rounds."""
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch

from labkit import proctree
from labkit.grading import rounds


@contextlib.contextmanager
def fake_side(first: str, each_round: str):
    """(process, Side) of a fake that serves requests as the grading child does: `first` runs once, then
    `each_round` (with `req` and the reply pipe `fd`) for every request until the end one. It is yielded once its
    imports are done (torch's takes seconds on a loaded machine), so that a round's time is the fake's own."""
    code = ("import json, os, sys, time\n"
            "import torch\n"
            "from labkit.grading import protocol, seal\n"
            "fd = int(sys.argv[1])\n"
            "os.write(int(sys.argv[2]), b'r')\n" + first +
            "while True:\n"
            "    req = json.loads(seal.read_frame(0))\n"
            "    if req.get('end'):\n"
            "        break\n" + textwrap.indent(each_round, "    "))
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", code, str(w), str(ready_w)], stdin=subprocess.PIPE,
                            pass_fds=(w, ready_w))
    os.close(w)
    os.close(ready_w)
    os.read(ready_r, 1)  # (empty if the fake died first: its test then fails on the replies)
    os.close(ready_r)
    try:
        yield proc, rounds.Side(proc.stdin, r)
    finally:
        proc.kill()
        os.close(r)


def test_the_round_is_timed_from_the_request_to_the_whole_reply_and_an_earlier_reply_is_passed_over():
    """A fake side that replies 0.2 s after each request; a reply to round 0 sent twice (as a student's code could)
    is passed over, and one for a later round is refused."""
    with fake_side("os.write(fd, protocol.encode_reply({'round': 0, 'kind': 'round', 'obs': 'stale'}))\n",
                   "time.sleep(0.2)\n"
                   "i = req['round'] + req['args']['skew']\n"
                   "os.write(fd, protocol.encode_reply({'round': i, 'kind': req['kind'], 'obs': 'fresh'}))\n"
                   ) as (proc, side):
        seconds, reply = side.timed({"round": 1, "kind": "round", "args": {"skew": 0}}, 30)
        assert reply == {"round": 1, "kind": "round", "obs": "fresh"} and 0.2 <= seconds < 5  # a fake: no served_s
        with pytest.raises(ValueError, match="a reply for round 3 to the request for round 2"):
            side.timed({"round": 2, "kind": "round", "args": {"skew": 1}}, 30)
        side.end()
        assert proc.wait(30) == 0


def test_on_a_cpu_a_round_counts_the_cpu_time_of_the_sides_processes_not_the_wall_clock():
    """A fake whose round sleeps 0.4 s, then works 0.15 s of CPU in a child process it reaps: timed on the side's
    CPU clock the round is the work (the sleep and another process's load left out); on the wall clock, both."""
    each = ("time.sleep(0.4)\n"
            "subprocess.run([sys.executable, '-S', '-c', 'import time\\nwhile time.process_time() < 0.15: pass'])\n"
            "os.write(fd, protocol.encode_reply({'round': req['round'], 'kind': req['kind'], 'obs': 1}))\n")
    with fake_side("import subprocess\n", each) as (proc, side):
        cpu, _ = side.timed({"round": 1, "kind": "round"}, 30, cpu=lambda: proctree.cpu_seconds(proc.pid))
        wall, _ = side.timed({"round": 2, "kind": "round"}, 30)
        side.end()
        assert proc.wait(30) == 0
    assert 0.13 <= cpu < 0.4 <= wall, (cpu, wall)  # (a reaped child counts to the clock tick: user, system)
    driver = rounds.Driver({}, "cpu", {}, None, lambda fn: 1.0, Path(os.devnull))
    assert driver._cpu_clock(types.SimpleNamespace(pid=os.getpid())) is not None
    assert rounds.Driver({}, "cuda", {}, None, lambda fn: 1.0, Path(os.devnull))._cpu_clock(None) is None


def test_a_served_workload_is_answered_in_the_parent_and_an_ask_where_none_is_served_is_refused():
    """A fake child whose round calls a served workload three times (the ask frame, then the parent's answer on its
    stdin): the parent's server counts and times the calls (exercise 03's Workload, sleeping here), the child only
    sees the answers."""
    from labkit.exercises.ex03_timing import SPAN, Workload, _served_result

    with fake_side("", "got = []\n"
                       "for _ in range(req['args']['calls']):\n"
                       "    os.write(fd, protocol.ASK_FRAME)\n"
                       "    got.append(json.loads(seal.read_frame(0)))\n"
                       "os.write(fd, protocol.encode_reply({'round': req['round'], 'kind': req['kind'], 'obs': got}))\n"
                   ) as (proc, side):
        load = Workload("cpu", 20.0, warmup=1, reps=3, outlier_at=5)
        seconds, reply = side.timed({"round": 1, "kind": "round", "args": {"calls": 4}}, 30, load.answer)
        assert reply["obs"] == [{}] * 4 and load.calls == 4 and len(load.asked) == len(load.answered) == 4
        assert 20.0 <= load.measured() < 200 and seconds >= (200 + 3 * 20) / 1e3  # a 10x warm-up call, then three
        # each timed call's bound holds its own sleep and the trips (the last one has none: inf), so the median of
        # three is the larger of the first two
        assert max(load.took[1:3]) <= load.span() < 1000
        assert _served_result({"ms": 20.0}, [reply["obs"]], [load])[SPAN] == load.span()
        gpu = Workload("cuda", 2.0, warmup=1, reps=2, outlier_at=0)
        assert [gpu.answer() for _ in range(3)] == [{"ms": 20.0}, {"ms": 20.0}, {"ms": 2.0}]  # told, not slept
        with pytest.raises(ValueError, match="no workload is served"):
            side.timed({"round": 2, "kind": "round", "args": {"calls": 1}}, 30)


def test_an_honest_timers_median_of_served_calls_never_exceeds_the_graders_bound_however_late_the_asks_come():
    """A child whose timer sees, around every other call, 15 ms the parent cannot see (an ask carried late, as a
    loaded machine's scheduler may): its median is over the time from one ask to the next, not over the bound."""
    from labkit.exercises.ex03_timing import Workload

    each = ("took = []\n"
            "for i in range(6):\n"
            "    t0 = time.perf_counter()\n"
            "    time.sleep(0.015 if i % 2 else 0)\n"
            "    os.write(fd, protocol.ASK_FRAME)\n"
            "    seal.read_frame(0)\n"
            "    took.append((time.perf_counter() - t0) * 1e3)\n"
            "os.write(fd, protocol.encode_reply({'round': req['round'], 'kind': req['kind'], 'obs': took}))\n")
    with fake_side("", each) as (proc, side):
        load = Workload("cpu", 2.0, warmup=1, reps=5, outlier_at=9)
        _, reply = side.timed({"round": 1, "kind": "round"}, 30, load.answer)
    mine = statistics.median(reply["obs"][1:])
    gaps = statistics.median((b - a) * 1e3 for a, b in zip(load.asked[1:], load.asked[2:]))
    assert mine > 15 and gaps < mine <= load.span(), (mine, gaps, load.span())  # ask to ask: 2 ms, 17 ms in turn


def test_a_served_answer_counts_from_the_graders_sleep_to_its_span_of_a_call_and_no_further():
    from labkit.exercises.ex03_timing import MEASURED, SPAN, compare_median, median_ms_case

    case = median_ms_case("served", "cpu", [1.5, 5.0], 2, 5, 3)
    seen = {"calls of fn": [7, 7], MEASURED: [1.6, 5.1], SPAN: [2.9, 30.0]}  # the second's span: far over its sleep
    assert not compare_median(case["expected"], {"median (ms)": [2.9, 5.3], **seen}, case["rtol"], case["atol"])
    assert not compare_median(case["expected"], {"median (ms)": [1.2, 7.1], **seen}, case["rtol"], case["atol"])
    # over the span's cap (1.25 x 5.1 + 1 = 7.4, then the tolerance): a loaded pipe does not widen it further
    assert compare_median(case["expected"], {"median (ms)": [1.6, 10.2], **seen}, case["rtol"], case["atol"])
    assert compare_median(case["expected"], {"median (ms)": [0.4, 5.1], **seen}, case["rtol"], case["atol"])


def test_the_students_time_limit_counts_its_own_rounds_not_the_baselines_turns():
    """Parent side: a fake student that takes 0.2 s a round, with 1 s of its own time and 1 s of the grader's
    between rounds (the baseline's turn, or a loaded machine's): after three rounds 0.4 s is left, not none; a
    reply later than the time left and the grace times out."""
    with fake_side("", "time.sleep(0.2)\n"
                       "os.write(fd, protocol.encode_reply({'round': req['round'], 'kind': req['kind'], 'obs': 1}))\n"
                   ) as (proc, side):
        rounds._ask_student(proc, side, [{"round": 0, "kind": "round"}], rounds.StudentClock(60.0))  # its start-up
        clock = rounds.StudentClock(1.0)
        for i in range(1, 4):
            time.sleep(1.0)  # the baseline's turn: the student's process is stopped, its clock too
            assert rounds._ask_student(proc, side, [{"round": i, "kind": "round"}], clock)[1]["obs"] == 1
        assert 0.1 < clock.left < 0.45, clock.left
        clock.spend(clock.left + 4.9)  # 0.1 s of grace left: the next 0.2 s round is late
        with pytest.raises(rounds.Stopped) as stopped:
            rounds._ask_student(proc, side, [{"round": 4, "kind": "round"}], clock)
        assert stopped.value.result == {"timeout": True}


def test_the_childs_alarm_counts_its_own_rounds_not_the_waits_between_them():
    """Child side (labkit/grading/child.py), in a process of its own: rounds of 0.3 s against a 1 s limit, with
    1 s between requests: three rounds are served and the fourth, past the student's own second, times out."""
    code = textwrap.dedent("""
        import json, signal, time, types
        from labkit.grading import child
        signal.signal(signal.SIGALRM, child._on_alarm)
        reqs = iter([{"round": i, "kind": "round", "args": {}} for i in range(4)] + [{"end": True}])
        out = []
        def requests():
            time.sleep(1.0)
            return json.dumps(next(reqs)).encode()
        child._serve_rounds({"f": lambda a: time.sleep(0.3) or 1}, "f", types.SimpleNamespace(run=lambda fn, a: fn(a)),
                            1.0, lambda e, t: repr(e), requests, out.append)
        print(json.dumps([["obs" in r, bool(r.get("timeout"))] for r in out]))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[True, False]] * 3 + [[False, True]]


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_every_process_below_the_student_is_stopped_and_started_again():
    """What a student starts (here a child in a session of its own, as a burner would be) stops with them."""
    code = ("import os, subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import os; os.setsid(); print(os.getpid(), flush=True)\\n"
            "while True: pass'], stdout=subprocess.PIPE, text=True)\n"
            "print(os.getpid(), p.stdout.readline().strip(), flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and set(pids) <= {proc.pid, *proctree.processes(proc.pid)}
        proctree.signal_tree(proc.pid, signal.SIGSTOP)
        time.sleep(0.2)
        assert {state(p) for p in [proc.pid, *pids]} == {"T"}
        proctree.signal_tree(proc.pid, signal.SIGCONT)
        time.sleep(0.2)
        assert "T" not in {state(p) for p in [proc.pid, *pids]}
    finally:
        for pid in proctree.processes(proc.pid)[::-1]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


def test_the_capstone_baseline_in_its_own_process_serves_the_same_rounds_as_the_students_side():
    """labkit.grading.baseline runs exercise 13's baseline on the parent's requests: its observation for a seed is
    the one the in-process BaselineTrainer gives (a CPU repeats bit for bit), and it stops on `end`."""
    from labkit.exercises import ex13_capstone as ex13

    sizes = {"model": {"seq": 16, "d_model": 32, "heads": 2, "layers": 1}, "batch": 4, "steps": 5, "windows": 16}
    args = {"sizes": sizes, "device": "cpu", "seed": 7}
    r, w = os.pipe()
    job = json.dumps({"function": "make_trainer", "device": "cpu", "cpus": None, "reply_fd": w})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LABKIT_QUICK": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "labkit.grading.baseline", job], stdin=subprocess.PIPE,
                            pass_fds=(w,), env=env)
    os.close(w)
    try:
        side = rounds.Side(proc.stdin, r)
        _, reply = side.timed({"round": 0, "kind": "round", "args": args}, 120)
        _, checked = side.timed({"round": 0, "kind": "check"}, 120)
        side.end()
        assert proc.wait(60) == 0 and checked.items() >= {"round": 0, "kind": "check", "checked": True}.items()
        assert 0 < checked["served_s"] < 1
    finally:
        proc.kill()
        os.close(r)
    mine = ex13.run_round(ex13.BaselineTrainer, args)
    assert reply["obs"]["losses"] == mine["losses"]
    assert torch.equal(reply["obs"]["logits"]["__tensor__"], mine["logits"]["__tensor__"])


class _Probes:
    """A baseline Side whose idle probes take the given seconds, in turn (the last one from then on)."""

    def __init__(self, seconds: list[float]):
        self.seconds, self.asked = list(seconds), 0

    def timed(self, req: dict, limit_s: float) -> tuple[float, dict]:
        assert req["kind"] == "idle"
        took = self.seconds[min(self.asked, len(self.seconds) - 1)]
        self.asked += 1
        return took, {"round": req["round"], "kind": "idle", "obs": took}


def test_a_baseline_round_on_a_gpu_waits_for_the_gpu_to_be_idle_and_work_left_queued_is_the_students(monkeypatch):
    monkeypatch.setattr(rounds, "IDLE_WAIT_S", 0.2)
    quiet = _Probes([0.2, 0.05, 1e-4, 1e-4, 2e-3, 1e-4, 1e-4, 1e-4])  # busy at first, then three quick in a row
    assert rounds._wait_for_idle_gpu(quiet, 3, sleep=lambda s: None) and quiet.asked == 8
    busy = _Probes([0.02])  # kernels the stopped student's process left queued keep it busy
    with pytest.raises(rounds.Stopped) as stop:
        rounds._wait_for_idle_gpu(busy, 3, sleep=lambda s: time.sleep(0.01))
    assert "still busy" in stop.value.result["error"] and "round 3 of yours" in stop.value.result["error"]
    shared = _Probes([0.02])  # a GPU shared with other students (--share-gpus): go on, blame no one
    assert not rounds._wait_for_idle_gpu(shared, 3, blame=False, sleep=lambda s: time.sleep(0.01))
    assert shared.asked > 1
