"""Speed checks the unit tests used to make, kept as a benchmark: run them on a quiet machine.

    .venv/bin/python tests/speed_checks.py            # all of them (a few minutes on a CPU)
    .venv/bin/python tests/speed_checks.py server_load fast_train

A unit test of logic runs on controlled timings (tests/fake_clock.py) and passes on any machine, however
loaded; whether this machine is fast enough is a measurement, so it lives here (and in the notebooks'
claims and `labkit bench`). Each check prints what it measured against the bound a unit test once asserted;
the exit code is 1 when one misses, which on a busy machine says more about the machine than the code.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def bench_sleep() -> tuple[bool, str]:
    """labkit.bench of a 2 ms sleep (was tests/test_timing.py: 1.9 <= median < 50 ms)."""
    from labkit.timing import bench

    t = bench(lambda: time.sleep(0.002), warmup_ms=1, rep_ms=20, min_reps=5, device="cpu")
    return 1.9 <= t.median_ms < 50, f"median {t.median_ms:.2f} ms (want 1.9 to 50)"


def server_round_trip() -> tuple[bool, str]:
    """A keep-alive round trip to the in-process server (was tests/test_server.py, Nagle: median < 20 ms)."""
    import httpx

    from labkit.serving import server
    from serving_util import serving

    app = server.make_app(lambda x: x[:, :2] * 3, 5, max_batch=4, max_delay_s=0.0, max_queue=64)
    with serving(app) as url, httpx.Client(trust_env=False, timeout=10) as client:
        times = []
        for _ in range(12):
            t0 = time.perf_counter()
            assert client.post(url + "/predict", json={"x": [1] * 5}).status_code == 200
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return median < 0.02, f"median round trip {median * 1e3:.1f} ms (want < 20; Nagle's delayed ACK costs ~40)"


def server_load() -> tuple[bool, str]:
    """The launched server, a 2 ms stand-in model, 1500 requests/s offered (was tests/test_server.py:
    > 750 requests/s answered, 1.5x one request per model call, in batches of more than 2 on average)."""
    from labkit.serving import client, loadgen

    body = json.dumps({"x": [0.5] * 8}).encode()
    with client.launch("--fake-ms", "2", "--d-in", "8", "--d-out", "2", "--max-batch", "64",
                       "--max-delay-ms", "2", "--max-queue", "4096") as srv:
        res = loadgen.run(srv.url, rate=1500, n=3000, payload=lambda i: body, max_s=2.0, timeout_s=20)
    ok = res.throughput > 750 and res.mean_batch > 2 and res.ok == res.sent
    return ok, f"{res.throughput:.0f} requests/s (want > 750), mean batch {res.mean_batch:.2f} (want > 2)"


def loadgen_open_loop() -> tuple[bool, str]:
    """The load generator against a 30 ms synthetic server at 60 requests/s (was tests/test_loadgen.py:
    throughput within 0.3x-3x of the rate, the client's p99 send lag under 1 s)."""
    from labkit.serving import loadgen
    from serving_util import serving
    from test_loadgen import payload, synthetic_app

    with serving(synthetic_app()) as url:
        r = loadgen.run(url, rate=60.0, n=40, payload=payload, max_s=5.0)
    ok = 0.3 * 60 < r.throughput < 3 * 60 and r.client_lag_ms < 1000
    return ok, f"{r.throughput:.1f} requests/s (want 18 to 180), client lag p99 {r.client_lag_ms:.1f} ms (want < 1000)"


def simulate_speed() -> tuple[bool, str]:
    """16 batcher simulations of 4000 requests (was tests/test_batcher.py: under 5 s)."""
    from labkit.serving.batchsim import curve, poisson_arrivals, simulate

    t = curve([1, 8, 64, 256], [1.8e-3, 1.8e-3, 2.2e-3, 4e-3])
    t0 = time.perf_counter()
    for rate in (50, 2_000, 60_000, 1e6):
        arr = poisson_arrivals(rate, 4000, seed=3)
        for delay in (0.0, 1e-3, 8e-3, 0.1):
            simulate(arr, t, 256, delay)
    took = time.perf_counter() - t0
    return took < 5, f"{took:.2f} s (want < 5)"


def fast_train() -> tuple[bool, str]:
    """Exercise 11's solution against slow_train, timed by the grader's own code (was tests/test_exercises.py and
    tests/test_grade.py: at least MIN_SPEEDUP)."""
    from labkit.exercises import ex11_profiling as ex11
    from test_exercises import SOLUTIONS, functions_from

    fast = functions_from(SOLUTIONS / "11_profiling.ipynb")["fast_train"]
    case = ex11.visible_fast_train()[0]
    got = ex11.call_fast_train(fast, case["args"])
    v = ex11._verdict(case["expected"], got)
    return bool(v and v.points), (f"{v.describe('slow_train')} (its lower bound must reach {ex11.MIN_SPEEDUP:g}x)"
                                  if v else "not measured")


def capstone() -> tuple[bool, str]:
    """Exercise 13 on the CPU workload, scored as the grader scores it (was tests/test_ex13_capstone.py: the solution
    earns at least the first threshold's points, the released baseline none)."""
    from labkit.exercises import ex13_capstone as ex13
    from test_exercises import EXERCISES, SOLUTIONS, functions_from

    case = ex13.visible_make_trainer()[0]
    first = ex13.THRESHOLDS["cpu"][0][1]
    out = []
    for who, folder in (("solution", SOLUTIONS), ("baseline", EXERCISES)):
        fn = functions_from(folder / "13_capstone.ipynb")["make_trainer"]
        frac, notes, details = ex13.score_capstone(case["expected"], ex13.call_make_trainer(fn, case["args"]))
        out.append((who, frac * ex13.MAX_POINTS, details.get("speedup", float("nan"))))
    ok = out[0][1] >= first and out[1][1] == 0
    return ok, "; ".join(f"{who} {sp:.2f}x: {pts:g} points" for who, pts, sp in out) + f" (want >= {first}, == 0)"


CHECKS = {f.__name__: f for f in (bench_sleep, server_round_trip, server_load, loadgen_open_loop, simulate_speed,
                                  fast_train, capstone)}


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        print(f"no check {', '.join(unknown)}; the checks are: {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    import labkit

    labkit.setup(device="cpu")
    missed = 0
    for name in names or list(CHECKS):
        ok, what = CHECKS[name]()
        missed += not ok
        print(f"{'ok  ' if ok else 'MISS'} {name:18} {what}", flush=True)
    print("(on a busy machine a miss is the machine's load: compare with a quiet run)" if missed
          else "all within bounds")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
