"""Built-in commands: ``llmp plugins``, ``llmp collect-env``, the clients ``llmp chat`` and ``llmp complete``,
and ``llmp bench``."""

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import CommandSpec


@hookimpl
def llmp_register_commands() -> Iterator[CommandSpec]:
    yield CommandSpec(
        name="serve", impl="llmp.cli.serve_cmd:serve", help="Serve a model over HTTP (OpenAI-compatible)."
    )
    yield CommandSpec(name="plugins", impl="llmp.cli.plugins_cmd:app", help="List and inspect plugins.")
    yield CommandSpec(
        name="collect-env", impl="llmp.cli.env_cmd:collect_env", help="Report versions, hardware and plugins."
    )
    yield CommandSpec(
        name="chat", impl="llmp.cli.client_cmd:chat", help="Chat with a model on an OpenAI-compatible server."
    )
    yield CommandSpec(
        name="complete",
        impl="llmp.cli.client_cmd:complete",
        help="Complete prompts with a model on an OpenAI-compatible server.",
    )
    yield CommandSpec(
        name="bench",
        impl="llmp.cli.bench_cmd:app",
        help="Benchmarks: `llmp bench throughput` and `latency` (offline), `llmp bench serve` (a server under load).",
    )
