"""One compute thread while another process competes for the CPU's cores, all of them otherwise.

Work split over torch's OpenMP team ends only when every thread of the team has done its part, so a
step waits for whichever thread the OS has descheduled. With one other CPU-bound process on a
2-core machine, the engine's two threads and that process take turns on two cores and a step gets
slower by more than the share of the cores taken (2.4-2.8x, docs/benchmarks.md). One thread keeps a
core to itself instead: the step costs what it costs on one thread alone.

The sign of competition is the time the engine's threads spend runnable but waiting for a core (Linux's
``/proc/self/task/*/schedstat``, second field), as a share of the time they could have run. Measured
over windows of steps; when it is high the engine computes on one thread, and now and then (after 5 s,
doubling to a minute while the competition lasts) it tries all its threads again for one window.
Linux only, CPU engines of one rank that were not given ``--num-threads``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("llmp.engine")

WINDOW_S = 0.5  # steps measured together
IDLE_GAP_S = 1.0  # a pause between steps longer than this starts a new window (an idle engine waits for nothing)
CONTENDED = 0.2  # share of the threads' time spent waiting for a core above which the cores are shared
PROBE_FIRST_S, PROBE_MAX_S = 5.0, 60.0


def run_delay_seconds() -> float | None:
    """Seconds this process's threads have spent runnable but not running, or None where the kernel does not
    say (no schedstat)."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9


class CoreShareGovernor:
    """Call ``after_step()`` after each step, in the thread that runs the model (torch's thread count is that
    thread's)."""

    def __init__(
        self,
        threads: int,
        set_threads: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
        run_delay: Callable[[], float | None] = run_delay_seconds,
    ) -> None:
        self.full = threads
        self.current = threads
        self._set_threads, self._clock, self._run_delay = set_threads, clock, run_delay
        self._probe_after = PROBE_FIRST_S
        self._single_since: float | None = None  # when the engine went to one thread
        self._start_window(clock())

    def _start_window(self, now: float) -> None:
        self._window_start, self._delay_start, self._last_step = now, self._run_delay(), now

    def after_step(self) -> None:
        now = self._clock()
        if now - self._last_step > IDLE_GAP_S or self._delay_start is None:
            self._start_window(now)
            return
        self._last_step = now
        elapsed = now - self._window_start
        if elapsed < WINDOW_S:
            return
        delay = self._run_delay()
        if delay is None:
            return
        waited = (delay - self._delay_start) / (elapsed * self.current)
        self._decide(waited, now)
        self._start_window(now)

    def _decide(self, waited: float, now: float) -> None:
        if self.current == 1:  # after a while, one window on every thread: is the competition gone?
            if now - self._single_since >= self._probe_after:
                self._use(self.full)
            return
        probing = self._single_since is not None
        if waited <= CONTENDED:
            if probing:
                log.info("the cores are free again: computing on %d threads", self.full)
                self._single_since, self._probe_after = None, PROBE_FIRST_S
            return
        if probing:  # still there: the next try comes later
            self._probe_after = min(self._probe_after * 2, PROBE_MAX_S)
        else:
            log.info(
                "another process competes for the cores (the engine's threads waited %.0f%% of the time for one): "
                "computing on 1 thread instead of %d",
                100 * waited,
                self.full,
            )
        self._single_since = now
        self._use(1)

    def _use(self, threads: int) -> None:
        self.current = threads
        self._set_threads(threads)
