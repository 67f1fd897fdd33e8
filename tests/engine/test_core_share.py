"""Compute on the cores other processes leave free (llmp.engine.core_share): the decisions, driven by a fake clock
and a fake count of the other processes' CPU time, then the Linux readers on a real competing process."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from llmp.engine.core_share import CoreShareGovernor, busy_seconds, others_cpu_seconds


class Machine:
    """A clock and the CPU seconds other processes have used, advanced step by step."""

    def __init__(self, cpus: int = 2) -> None:
        self.cpus, self.now, self.others, self.threads_set = cpus, 100.0, 0.0, []

    def governor(self, threads: int = 2) -> CoreShareGovernor:
        return CoreShareGovernor(
            threads, self.threads_set.append, self.cpus, others=lambda: self.others, clock=lambda: self.now
        )

    def steps(self, governor: CoreShareGovernor, seconds: float, others_cores: float, step_s: float = 0.05) -> None:
        """Steps for ``seconds`` while the other processes keep ``others_cores`` cores busy."""
        for _ in range(round(seconds / step_s)):
            governor.before_step()
            self.now += step_s
            self.others += step_s * others_cores
            governor.after_step()

    def pause(self, seconds: float, others_cores: float) -> None:
        self.now += seconds
        self.others += seconds * others_cores


def test_alone_the_engine_keeps_every_thread():
    machine = Machine()
    governor = machine.governor()
    machine.steps(governor, 10, others_cores=0.1)
    assert governor.current == 2 and machine.threads_set == []


def test_a_competitor_taking_a_core_brings_one_thread_and_its_end_brings_them_back(caplog):
    machine = Machine()
    governor = machine.governor()
    with caplog.at_level(logging.INFO, logger="llmp.engine"):
        machine.steps(governor, 1.2, others_cores=1.0)
        assert governor.current == 1 and machine.threads_set == [1]
        assert "other processes keep 1.0 of this process's 2 cores busy: computing on 1 thread instead of 2" in (
            caplog.text
        )
        machine.steps(governor, 30, others_cores=1.0)  # no window is spent trying both threads meanwhile
        assert machine.threads_set == [1]
        machine.steps(governor, 1.2, others_cores=0.0)
        assert governor.current == 2 and machine.threads_set == [1, 2]
        assert "the cores are free again: computing on 2 threads" in caplog.text


def test_a_light_or_wavering_competitor_changes_nothing_either_way():
    machine = Machine()
    governor = machine.governor()
    machine.steps(governor, 5, others_cores=0.6)  # under the 0.7 of a core that counts as taken
    assert governor.current == 2
    machine.steps(governor, 1.2, others_cores=0.9)
    assert governor.current == 1
    machine.steps(governor, 5, others_cores=0.6)  # over the 0.5 below which a core is free again
    assert governor.current == 1 and machine.threads_set == [1]


def test_what_ran_while_the_engine_waited_decides_nothing():
    machine = Machine()
    governor = machine.governor()
    machine.steps(governor, 1.0, others_cores=0.0)
    machine.pause(3.0, others_cores=2.0)  # another engine takes its turn while this one waits for work
    machine.steps(governor, 1.2, others_cores=0.0)
    assert governor.current == 2 and machine.threads_set == []


def test_a_competitor_that_started_while_the_engine_waited_is_seen_in_the_first_window_of_steps():
    machine = Machine()
    governor = machine.governor()
    machine.steps(governor, 1.0, others_cores=0.0)
    machine.pause(3.0, others_cores=1.0)
    machine.steps(governor, 0.6, others_cores=1.0)
    assert governor.current == 1 and machine.threads_set == [1]


def test_more_cores_give_up_only_the_cores_taken():
    machine = Machine(cpus=8)
    governor = machine.governor(threads=8)
    machine.steps(governor, 1.2, others_cores=2.0)
    assert governor.current == 6
    machine.steps(governor, 1.2, others_cores=1.0)
    assert governor.current == 7 and machine.threads_set == [6, 7]


def test_threads_fewer_than_the_cpus_keep_going_while_a_cpu_is_left_to_them():
    machine = Machine(cpus=4)  # e.g. two threads on four logical CPUs
    governor = machine.governor(threads=2)
    machine.steps(governor, 2, others_cores=1.0)
    assert governor.current == 2 and machine.threads_set == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/stat")
def test_the_linux_readers_see_a_competing_process_and_not_this_one():
    cpus = frozenset(os.sched_getaffinity(0))
    assert busy_seconds(cpus) is not None and busy_seconds(frozenset({max(cpus) + 4096})) is None
    assert CoreShareGovernor.for_this_process(2, lambda n: None) is not None
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the interpreter started
        before, start = others_cpu_seconds(cpus), time.monotonic()
        time.sleep(1.0)
        seen = others_cpu_seconds(cpus) - before
    finally:
        spinner.kill()
        spinner.wait()
    assert seen >= 0.5 * (time.monotonic() - start), seen  # the spinner's core (shared at worst with a neighbour)
    before, spun = others_cpu_seconds(cpus), time.process_time()
    while time.process_time() - spun < 0.5:  # this process's own work is not another's
        pass
    assert others_cpu_seconds(cpus) - before < 0.4
