"""Compute on the cores other processes leave free (llmp.engine.core_share): the decisions, driven by a fake clock
and a machine that shares its CPUs out as the OS does, then the Linux readers on a real competing process."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from llmp.engine.core_share import CoreShareGovernor, busy_seconds, cpu_seconds


class Machine:
    """A clock and the CPU seconds used by the engine and by the other processes, advanced step by step: ``rival``
    CPU-bound threads of other processes share the CPUs fairly with the engine's threads, ``light`` cores of
    other work always get what they ask for."""

    def __init__(self, cpus: int = 2) -> None:
        self.cpus, self.now, self.others, self.own, self.threads_set = cpus, 100.0, 0.0, 0.0, []

    def governor(self, threads: int = 2) -> CoreShareGovernor:
        return CoreShareGovernor(
            threads,
            self.threads_set.append,
            self.cpus,
            cpu_seconds=lambda: (self.others, self.own),
            clock=lambda: self.now,
        )

    def share(self, threads: int, rival: float, light: float) -> tuple[float, float]:
        """Cores (others, engine) while the engine runs ``threads`` threads."""
        cpus = self.cpus - light
        if threads + rival > cpus:
            return light + rival * cpus / (threads + rival), threads * cpus / (threads + rival)
        return light + rival, threads

    def steps(self, governor: CoreShareGovernor, seconds: float, rival: float = 0, light: float = 0) -> None:
        step_s = 0.05
        for _ in range(round(seconds / step_s)):
            governor.before_step()
            others, own = self.share(governor.current, rival, light)
            self.now += step_s
            self.others, self.own = self.others + step_s * others, self.own + step_s * own
            governor.after_step()

    def pause(self, seconds: float, rival: float) -> None:
        """The engine waits for work while ``rival`` threads run."""
        self.now += seconds
        self.others += seconds * min(rival, self.cpus)


def test_alone_the_engine_keeps_every_thread():
    machine = Machine()
    governor = machine.governor()
    machine.steps(governor, 10, light=0.1)
    assert governor.current == 2 and machine.threads_set == []


def test_a_competitor_taking_a_core_brings_one_thread_and_its_end_brings_them_back(caplog):
    machine = Machine()
    governor = machine.governor()
    with caplog.at_level(logging.INFO, logger="llmp.engine"):
        machine.steps(governor, 1.2, rival=1)  # it gets two thirds of a core beside two threads
        assert governor.current == 1 and machine.threads_set == [1]
        assert (
            "other processes take 1.0 of this process's 2 cores (0.7 beside its 2 threads): computing on 1 thread"
            in caplog.text
        )
        machine.steps(governor, 30, rival=1)  # no window is spent trying both threads meanwhile
        assert machine.threads_set == [1]
        machine.steps(governor, 1.2)
        assert governor.current == 2 and machine.threads_set == [1, 2]
        assert "the cores are free again: computing on 2 threads" in caplog.text


def test_a_light_or_wavering_load_changes_nothing_either_way():
    machine = Machine()
    governor = machine.governor()
    machine.steps(governor, 5, light=0.45)  # would take 0.58 of a core: under the 0.7 that counts as taken
    assert governor.current == 2
    machine.steps(governor, 1.2, rival=1)
    assert governor.current == 1
    machine.steps(governor, 5, light=0.6)  # over the 0.5 below which a core is free again
    assert governor.current == 1 and machine.threads_set == [1]


def test_what_ran_while_the_engine_waited_decides_nothing():
    machine = Machine()
    governor = machine.governor()
    machine.steps(governor, 1.0)
    machine.pause(3.0, rival=2)  # another engine takes its turn while this one waits for work
    machine.steps(governor, 1.2)
    assert governor.current == 2 and machine.threads_set == []


def test_a_competitor_that_started_while_the_engine_waited_is_seen_in_the_first_window_of_steps():
    machine = Machine()
    governor = machine.governor()
    machine.steps(governor, 1.0)
    machine.pause(3.0, rival=1)
    machine.steps(governor, 0.6, rival=1)
    assert governor.current == 1 and machine.threads_set == [1]


def test_more_cores_give_up_only_the_cores_taken():
    machine = Machine(cpus=8)
    governor = machine.governor(threads=8)
    machine.steps(governor, 1.2, rival=2)
    assert governor.current == 6
    machine.steps(governor, 1.2, rival=2)
    assert governor.current == 6
    machine.steps(governor, 1.2, rival=1)
    assert governor.current == 7 and machine.threads_set == [6, 7]


def test_threads_fewer_than_the_cpus_keep_going_while_a_cpu_is_left_to_them():
    machine = Machine(cpus=4)  # e.g. two threads on four logical CPUs
    governor = machine.governor(threads=2)
    machine.steps(governor, 2, rival=1)
    assert governor.current == 2 and machine.threads_set == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/stat")
def test_the_linux_readers_see_a_competing_process_and_this_one_apart():
    cpus = frozenset(os.sched_getaffinity(0))
    assert busy_seconds(cpus) is not None and busy_seconds(frozenset({max(cpus) + 4096})) is None
    assert CoreShareGovernor.for_this_process(2, lambda n: None) is not None
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the interpreter started
        (others_before, _), start = cpu_seconds(cpus), time.monotonic()
        time.sleep(1.0)
        seen = cpu_seconds(cpus)[0] - others_before
    finally:
        spinner.kill()
        spinner.wait()
    assert seen >= 0.5 * (time.monotonic() - start), seen  # the spinner's core (shared at worst with a neighbour)
    # this process's own work is its own, not another's: what the others use while it spins for half a second is
    # no more than while it sleeps as long (neighbours, such as another test worker, count in both; one quiet try
    # of three is enough, and counting the spin as theirs would add half a second to every try)
    differences, owns = [], []
    for _ in range(3):
        others_sleeping, _ = others_over(cpus, 0.5, spin=False)
        others_spinning, own_spinning = others_over(cpus, 0.5, spin=True)
        owns.append(own_spinning)
        differences.append(others_spinning - others_sleeping)
    assert max(owns) >= 0.3, owns  # its spin counted as its own (on a busy machine it may not get the core each try)
    assert min(differences) < 0.25, differences


def others_over(cpus: frozenset[int], seconds: float, spin: bool) -> tuple[float, float]:
    """CPU seconds (the other processes', this one's) used over ``seconds`` of wall time spent spinning or asleep."""
    others_before, own_before = cpu_seconds(cpus)
    end = time.monotonic() + seconds
    if spin:
        while time.monotonic() < end:
            pass
    else:
        time.sleep(seconds)
    others, own = cpu_seconds(cpus)
    return others - others_before, own - own_before
