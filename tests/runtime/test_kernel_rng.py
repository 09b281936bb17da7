"""The virtual-time kernel and the seed tree."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from fedsim.clock import Clock
from fedsim.config.distributions import LogNormal
from fedsim.runtime.rng import ParkedStream, SeedTree
from fedsim.runtime.simulated.kernel import (
    VirtualClock,
    VirtualDeadlock,
    VirtualTimeLoop,
    run_virtual,
)


def test_time_jumps_to_the_next_timer_without_waiting() -> None:
    log: list[tuple[float, str]] = []

    async def main(clock: VirtualClock) -> float:
        async def ticker(name: str, period: float, count: int) -> None:
            for _ in range(count):
                await clock.sleep(period)
                log.append((clock.now(), name))

        await asyncio.gather(ticker("a", 1.5, 4), ticker("b", 2.0, 3))
        return clock.now()

    started = time.perf_counter()
    end = run_virtual(main)
    assert time.perf_counter() - started < 2.0
    assert end == 6.0
    # Equal times fire in the order the timers were set (b set its 6.0 timer at 4.0, a at 4.5).
    assert log == [(1.5, "a"), (2.0, "b"), (3.0, "a"), (4.0, "b"), (4.5, "a"), (6.0, "b"),
                   (6.0, "a")]


@pytest.mark.parametrize("start", [0.0, 4.4e6, 2.0**24, 1e9, 1e15])
def test_timers_still_fire_where_a_nanosecond_is_below_a_floats_step(start: float) -> None:
    """Past about 10^7 virtual s (2^23-2^24, four months) now + 1 ns rounds to now: the loop
    once never ran a timer due then and spun forever. Timers due at now, and ones a float's
    step apart, still fire in order."""

    async def main(clock: VirtualClock) -> list[float]:
        seen: list[float] = []
        await clock.sleep(start)
        for _ in range(3):
            await clock.sleep(1.0)
            seen.append(clock.now())
        step = math.ulp(clock.now())
        await clock.sleep(step)  # the smallest sleep that moves the clock
        seen.append(clock.now())
        return seen

    seen = run_virtual(main)
    assert seen[:3] == [start + 1.0, start + 2.0, start + 3.0]
    assert seen[3] == math.nextafter(start + 3.0, math.inf)


def test_asyncio_primitives_work_in_virtual_time() -> None:
    async def main(clock: VirtualClock) -> tuple[str, float, int]:
        queue: asyncio.Queue[int] = asyncio.Queue()
        try:
            await asyncio.wait_for(queue.get(), timeout=1000.0)
            outcome = "got"
        except TimeoutError:
            outcome = "timeout"
        at = clock.now()
        loop = asyncio.get_running_loop()
        loop.call_later(5.0, queue.put_nowait, 42)
        value = await queue.get()
        return outcome, at, value

    assert run_virtual(main) == ("timeout", 1000.0, 42)


def test_a_stuck_simulation_raises_instead_of_hanging() -> None:
    async def main(clock: VirtualClock) -> None:
        await asyncio.Event().wait()

    with pytest.raises(VirtualDeadlock, match="no timer"):
        run_virtual(main)


def test_a_sleep_for_ever_with_nothing_else_to_do_is_a_deadlock() -> None:
    async def main(clock: VirtualClock) -> None:
        await clock.sleep(math.inf)  # a timer never due: it spun at 100% CPU before

    with pytest.raises(VirtualDeadlock, match="nothing can ever happen"):
        run_virtual(main)


def test_real_io_and_threads_are_refused() -> None:
    async def main(clock: VirtualClock) -> None:
        await asyncio.get_running_loop().run_in_executor(None, print)

    with pytest.raises(RuntimeError, match="runs no threads"):
        run_virtual(main)


def test_virtual_clock_is_a_clock_and_starts_at_zero() -> None:
    loop = VirtualTimeLoop(start=100.0)
    clock = VirtualClock(loop)
    assert isinstance(clock, Clock)
    assert clock.now() == 0.0
    loop.close()


def test_same_program_same_interleaving() -> None:
    def trace(seed: int) -> list[tuple[float, int]]:
        events: list[tuple[float, int]] = []

        async def main(clock: VirtualClock) -> None:
            rng = np.random.default_rng(seed)

            async def worker(k: int) -> None:
                for _ in range(20):
                    await clock.sleep(float(rng.exponential(1.0)))
                    events.append((clock.now(), k))

            await asyncio.gather(*(worker(k) for k in range(5)))

        run_virtual(main)
        return events

    assert trace(1) == trace(1)
    assert trace(1) != trace(2)


def test_seed_tree_streams_are_stable_and_independent() -> None:
    tree = SeedTree(7)
    a1 = tree.child("client", "c1").numpy("speed").random(4)
    a2 = SeedTree(7).child("client", "c1").numpy("speed").random(4)
    b = tree.child("client", "c2").numpy("speed").random(4)
    c = tree.child("client", "c1").numpy("noise").random(4)
    np.testing.assert_array_equal(a1, a2)
    assert not np.allclose(a1, b) and not np.allclose(a1, c)
    assert not np.allclose(a1, SeedTree(8).child("client", "c1").numpy("speed").random(4))
    g1, g2 = tree.torch("x"), SeedTree(7).torch("x")
    assert g1.initial_seed() == g2.initial_seed() != tree.torch("y").initial_seed()
    with pytest.raises(ValueError):
        SeedTree(-1)


def test_the_kernel_runs_only_on_the_python_versions_it_was_tested_on() -> None:
    """The kernel uses asyncio internals: importing it on an untested Python is a clear
    error naming the tested versions, and pyproject's requires-python has the same bounds."""
    import sys
    import tomllib
    from pathlib import Path

    from fedsim.runtime.simulated.kernel import TESTED_PYTHONS, check_python

    assert tuple(sys.version_info[:2]) in TESTED_PYTHONS  # this run is on one of them
    check_python((3, 11))
    with pytest.raises(ImportError, match=r"tested on Python 3\.11, 3\.12, 3\.13; this is "
                                          r"Python 3\.14"):
        check_python((3, 14))
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    requires = tomllib.loads(pyproject.read_text())["project"]["requires-python"]
    low, high = min(TESTED_PYTHONS), max(TESTED_PYTHONS)
    assert requires == f">={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}"


def test_timers_fire_in_when_then_sequence_order_cancelled_ones_never() -> None:
    """The loop's own iteration (tuple heap entries, no selector) runs timers exactly in the
    (when, sequence) order a plain sort gives, ties first-set first-run, skips cancelled ones
    (through the heap's rebuild too: over 100 timers, more than half cancelled), and the
    clock shows each timer's own time when it fires (one within the 1 ns resolution of now,
    2**-1074, runs at now, as asyncio's loops run it)."""
    rng = np.random.default_rng(5)
    whens = [float(w) for w in rng.choice([0.0, 0.25, 0.5, 1.0, 1e-9, 2.0**-1074, 3.0], 400)]
    cancel = set(rng.choice(400, 260, replace=False).tolist())
    fired: list[tuple[int, float]] = []

    async def main(clock: VirtualClock) -> None:
        loop = asyncio.get_running_loop()
        timers = []
        for k, when in enumerate(whens):
            if k % 2:
                timers.append(loop.call_at(when, lambda k=k: fired.append((k, loop.time()))))
            else:
                timers.append(loop.call_later(when, lambda k=k: fired.append((k, loop.time()))))
        for k in sorted(cancel):
            timers[k].cancel()
        await asyncio.sleep(4.0)

    run_virtual(main)
    expected = sorted((when, k) for k, when in enumerate(whens) if k not in cancel)
    assert fired == [(k, when if when >= 1e-9 else 0.0) for when, k in expected]


def test_a_parked_stream_draws_what_its_own_generator_draws() -> None:
    """Two parked streams interleaved (each swapped in and out of the one shared generator)
    draw bit for bit what their own generators draw: 64-bit, 32-bit (the cached half of a
    64-bit word is part of the parked state), normal, log-normal and bounded integer draws."""
    tree = SeedTree(11)
    plain = [tree.numpy("client", name, "speed") for name in ("a", "b")]
    parked = [ParkedStream(tree.numpy("client", name, "speed")) for name in ("a", "b")]
    draws = [
        lambda g: g.standard_normal(),
        lambda g: g.integers(0, 2**31, size=3, dtype=np.uint32),  # 32-bit: one cached half
        lambda g: g.lognormal(0.0, 0.5, size=2),
        lambda g: g.random(),
        lambda g: g.integers(0, 7),
        lambda g: g.exponential(2.0, size=5),
        lambda g: g.integers(0, 2**16, size=1, dtype=np.uint16),
    ]
    for i in range(700):
        draw = draws[i % len(draws)]
        which = (i * 7) % 3 % 2
        expected, got = draw(plain[which]), parked[which].draw(draw)
        assert np.array_equal(expected, got), (i, expected, got)
    # A speed distribution of the scenario, as the client actor draws it.
    speed = LogNormal(kind="lognormal", median=10.0, sigma=0.5)
    own, stream = tree.numpy("speed"), ParkedStream(tree.numpy("speed"))
    assert [speed.sample(own) for _ in range(50)] == [stream.draw(speed.sample)
                                                      for _ in range(50)]


def test_only_a_pcg64_stream_is_parked() -> None:
    with pytest.raises(TypeError, match="PCG64"):
        ParkedStream(np.random.Generator(np.random.MT19937(3)))
