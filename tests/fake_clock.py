"""A clock that moves only when told, for unit tests of timing logic (speed itself is measured by benchmarks).

Install it as the `time` module of the code under test (`monkeypatch.setattr(module, "time", clock)`): its
perf_counter/monotonic read the fake time, `sleep` records the request and moves the clock instead of waiting,
and the code under test advances it by exactly the durations the test chooses.
"""
from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 1000.0):  # not 0.0: code may treat a falsy timestamp as "unset"
        self.now = start
        self.slept: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter
    time = perf_counter

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += max(0.0, seconds)


class AsyncioOnClock:
    """The asyncio module as the code under test sees it, except that `sleep` moves `clock` instead of waiting
    (then yields to the event loop once): install with `monkeypatch.setattr(module, "asyncio", AsyncioOnClock(c))`."""

    def __init__(self, clock: FakeClock):
        self._clock = clock

    def __getattr__(self, name: str):
        import asyncio

        return getattr(asyncio, name)

    async def sleep(self, seconds: float, result=None):
        import asyncio

        self._clock.sleep(seconds)
        await asyncio.sleep(0)
        return result
