"""Compute on the cores other processes leave free: fewer threads while another process competes, all again after.

Work split over torch's OpenMP team ends only when every thread of the team has done its part, so a
step waits for whichever thread the OS has descheduled. With one other CPU-bound process on a
2-core machine, the engine's two threads and that process take turns on two cores and a step gets
slower by more than the share of the cores taken (2.4-2.8x, docs/benchmarks.md). One thread keeps a
core to itself instead: the step costs what it costs on one thread alone (1.6x on that machine).

The measure is what the other processes would take of the CPUs this process may run on: the CPUs' busy
time (Linux's ``/proc/stat``) less this process's own CPU time, in cores, over windows of at least half a
second of steps, scaled up by the OS's fair share where every CPU was busy (``_demand``). It reads about the
same whatever the engine's thread count, so no window is spent trying all threads to see whether the
competition has gone. A window spans steps only: after the engine idles a new one starts, since what ran
while it waited (another engine taking its turn) may be gone, and giving up a thread wrongly costs far more
(nearly half the speed) than keeping one a window too long (under a tenth). Linux only, CPU engines of one
rank that were not given ``--num-threads``.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

log = logging.getLogger("llmp.engine")

WINDOW_S = 0.5  # shortest span measured (the clock ticks of /proc/stat are 10 ms)
IDLE_S = 0.1  # a longer gap between steps is the engine waiting for work: the window starts again
# A core counts as taken when the others would use more than this much of it on average; as free again below RETURN.
TAKEN, RETURN = 0.7, 0.5
SPARE = 0.25  # the CPUs were all busy when less than this many cores' worth of time was idle


def busy_seconds(cpus: frozenset[int]) -> float | None:
    """Seconds the given CPUs have spent running anything, from ``/proc/stat`` (idle, I/O wait and a
    hypervisor's steal time excluded), or None where the kernel does not say."""
    try:
        with open("/proc/stat") as f:
            lines = f.readlines()
    except OSError:
        return None
    ticks, seen = 0, 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
        ticks += user + nice + system + irq + softirq
        seen += 1
    return ticks / os.sysconf("SC_CLK_TCK") if seen == len(cpus) else None


def cpu_seconds(cpus: frozenset[int]) -> tuple[float, float] | None:
    """CPU seconds used on ``cpus`` so far: (by other processes, by this one). The others' are the CPUs' busy time
    less this process's CPU time."""
    busy = busy_seconds(cpus)
    if busy is None:
        return None
    own = time.process_time()
    return busy - own, own


class CoreShareGovernor:
    """Call ``before_step()`` and ``after_step()`` around each step, in the thread that runs the model (torch's
    thread count is that thread's)."""

    def __init__(
        self,
        threads: int,
        set_threads: Callable[[int], None],
        cpus: int,
        cpu_seconds: Callable[[], tuple[float, float] | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.full = self.current = threads
        self.cpus = cpus
        self._set_threads, self._cpu_seconds, self._clock = set_threads, cpu_seconds, clock
        self._window_start, self._start_seconds = clock(), None
        self._last_step_end = -math.inf

    @classmethod
    def for_this_process(cls, threads: int, set_threads: Callable[[int], None]) -> CoreShareGovernor | None:
        """A governor over the CPUs this process may run on, or None where Linux does not say what they do."""
        cpus = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
        if not cpus or cpu_seconds(cpus) is None:
            return None
        return cls(threads, set_threads, len(cpus), lambda: cpu_seconds(cpus))

    def before_step(self) -> None:
        now = self._clock()
        if now - self._last_step_end > IDLE_S:
            self._window_start, self._start_seconds = now, self._cpu_seconds()
            return
        elapsed = now - self._window_start
        if elapsed < WINDOW_S:
            return
        seconds, start = self._cpu_seconds(), self._start_seconds
        if seconds is not None and start is not None:
            others, own = (max(0.0, seconds[i] - start[i]) / elapsed for i in (0, 1))
            self._decide(others, self._demand(others, own))
        self._window_start, self._start_seconds = now, seconds

    def after_step(self) -> None:
        self._last_step_end = self._clock()

    def _demand(self, others: float, own: float) -> float:
        """The cores the other processes would keep busy beside this one, from what they (``others``) and this
        process (``own``) used, in cores on average. Where the CPUs had time to spare, what the others used is what
        they asked for. Where every CPU was busy, the OS shared them out between the runnable threads: the others
        got ``others`` against this process's ``own`` on ``current`` threads, so they ran about ``others /
        own * current`` threads' worth (a CPU-bound process beside two engine threads on two cores gets two thirds
        of a core and would take a whole one beside one thread)."""
        if others + own < self.cpus - SPARE or own <= 0:
            return others
        return others / own * self.current

    def _decide(self, others: float, demand: float) -> None:
        """``others``: the cores the other processes kept busy over the window; ``demand``: what they would take."""
        free = self.cpus - demand
        fits = max(1, min(self.full, math.floor(free + TAKEN)))  # threads that still have a core each
        clearly_fits = max(1, min(self.full, math.floor(free + RETURN)))
        if fits < self.current:
            threads = fits
        elif clearly_fits > self.current:
            threads = clearly_fits
        else:
            return
        if threads < self.current:
            log.info(
                "other processes take %.1f of this process's %d cores (%.1f beside its %d threads): "
                "computing on %d thread%s",
                demand,
                self.cpus,
                others,
                self.current,
                threads,
                "" if threads == 1 else "s",
            )
        else:
            log.info("the cores are free again: computing on %d threads", threads)
        self.current = threads
        self._set_threads(threads)
