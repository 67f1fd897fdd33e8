"""A worker process of the ``mp`` executor: ``python -m llmp_executors_mp.worker``.

Its arguments arrive pickled on stdin from the engine (a trusted pipe). It
answers every command except a successful ``execute_model`` on ranks above 0
(rank 0's answer carries the logits), and reports any error before exiting, except
in a ``collective_rpc`` call: that one's error is its answer, and the worker goes on.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import traceback

import zmq

from llmp.executor import exit_with_parent, rpc_outcome


def main() -> None:
    config, model, rank, world_size, init_method, commands_address, results_address, parent_pid = pickle.load(
        sys.stdin.buffer
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine decides when workers stop
    threading.Thread(target=exit_with_parent, args=(parent_pid,), daemon=True).start()
    context = zmq.Context()
    commands = context.socket(zmq.PULL)
    commands.connect(commands_address)
    results = context.socket(zmq.PUSH)
    results.connect(results_address)

    call = 0  # the command being answered (replies carry it, so the engine can drop late ones)

    def reply(ok: bool, payload: object) -> None:
        results.send(pickle.dumps((rank, call, ok, payload), protocol=pickle.HIGHEST_PROTOCOL))

    try:
        from llmp.executor import Worker

        worker = Worker(config, model, rank, world_size, init_method)
        reply(True, worker.describe())
        while True:
            call, method, args = pickle.loads(commands.recv())
            if method == "shutdown":
                break
            if method == "collective_rpc":  # a failing call is answered, and the rank goes on
                outcome = rpc_outcome(worker, *args)
                try:
                    reply(True, outcome)
                except Exception as exc:  # a result pickle cannot carry
                    reply(True, (False, f"its result cannot be sent back: {type(exc).__name__}: {exc}"))
                continue
            result = getattr(worker, method)(*args)
            if method != "execute_model" or rank == 0:
                reply(True, result)
    except Exception as exc:
        traceback.print_exc()  # the whole story to the worker's stderr; the engine gets the gist
        reply(False, f"{type(exc).__name__}: {exc}")
        # the message leaves before the process does: term() waits for it (up to the linger); os._exit skips finally
        results.close(linger=5000)
        commands.close(linger=0)
        context.term()
        os._exit(1)
    finally:
        results.close(linger=1000)
        commands.close(linger=0)


if __name__ == "__main__":
    main()
