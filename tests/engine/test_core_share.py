"""One compute thread while another process competes for the cores (llmp.engine.core_share), driven by a fake
clock and a fake run-queue delay: the decisions, the probes and their back-off."""

from __future__ import annotations

import logging

from llmp.engine.core_share import PROBE_FIRST_S, CoreShareGovernor, run_delay_seconds


class Machine:
    """A clock and the engine threads' run-queue delay, advanced step by step."""

    def __init__(self) -> None:
        self.now, self.delay, self.threads_set = 100.0, 0.0, []

    def governor(self, threads: int = 2) -> CoreShareGovernor:
        return CoreShareGovernor(threads, self.threads_set.append, clock=lambda: self.now, run_delay=lambda: self.delay)

    def steps(self, governor: CoreShareGovernor, seconds: float, waiting_share: float, step_s: float = 0.05) -> None:
        """Steps for ``seconds``, each thread waiting ``waiting_share`` of the time for a core."""
        for _ in range(round(seconds / step_s)):
            self.now += step_s
            self.delay += step_s * waiting_share * governor.current
            governor.after_step()


def test_alone_the_engine_keeps_every_thread():
    machine = Machine()
    governor = machine.governor()
    machine.steps(governor, 10, waiting_share=0.02)
    assert governor.current == 2 and machine.threads_set == []


def test_competition_brings_one_thread_and_its_end_brings_them_back(caplog):
    machine = Machine()
    governor = machine.governor()
    with caplog.at_level(logging.INFO, logger="llmp.engine"):
        machine.steps(governor, 1.0, waiting_share=0.35)
        assert governor.current == 1 and machine.threads_set == [1]
        assert "another process competes for the cores (the engine's threads waited 35%" in caplog.text
        # on one thread the engine has a core to itself: it waits no more, which says nothing of the other core
        machine.steps(governor, PROBE_FIRST_S - 1, waiting_share=0.0)
        assert governor.current == 1
        machine.steps(governor, 1.2, waiting_share=0.0)  # the probe: every thread for a window, no wait
        assert governor.current == 2 and machine.threads_set == [1, 2]
        machine.steps(governor, 1.0, waiting_share=0.0)
        assert governor.current == 2
        assert "the cores are free again: computing on 2 threads" in caplog.text


def test_a_probe_that_finds_the_competition_backs_off():
    machine = Machine()
    governor = machine.governor()
    machine.steps(governor, 1.0, waiting_share=0.4)  # one thread from here
    probes = []
    for _ in range(140):  # 70 s: tries after 5, 10 and 20 s more
        before = len(machine.threads_set)
        machine.steps(governor, 0.5, waiting_share=0.4)
        if machine.threads_set[before:] == [2]:
            probes.append(machine.now)
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert len(probes) >= 3 and all(b > a for a, b in zip(gaps, gaps[1:])), gaps  # each try waits longer
    assert governor.current in (1, 2)


def test_an_idle_engine_measures_no_window_across_its_pause():
    machine = Machine()
    governor = machine.governor()
    machine.steps(governor, 0.3, waiting_share=0.0)
    machine.now += 30  # idle: no steps, while the delay counter grows from other threads' work
    machine.delay += 20
    machine.steps(governor, 1.0, waiting_share=0.0)
    assert governor.current == 2 and machine.threads_set == []


def test_the_run_queue_delay_is_read_from_linux():
    first = run_delay_seconds()
    assert first is not None and first >= 0.0
    sum(i * i for i in range(200_000))
    assert run_delay_seconds() >= first
