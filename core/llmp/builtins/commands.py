"""Built-in commands: ``llmp plugins``, ``llmp collect-env``, the clients ``llmp chat`` and ``llmp complete``,
``llmp bench``, and the local models' ``llmp pull``, ``llmp ls`` and ``llmp rm``."""

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
    where = (
        "MODEL (a directory, .gguf file or Hub id) starts an engine in this process; without it the client "
        "talks to the server at --url (default http://127.0.0.1:8000). Not both."
    )
    yield CommandSpec(
        name="chat",
        impl="llmp.cli.client_cmd:chat",
        help="Chat with a model on a server, or run MODEL here.\n\n"
        f"{where} At a terminal: Ctrl-C stops a reply, Ctrl-D or /exit quits, /help lists the commands "
        "(/clear, /system TEXT, /save FILE). Piped stdin: one message per line until EOF.",
    )
    yield CommandSpec(
        name="complete",
        impl="llmp.cli.client_cmd:complete",
        help="Complete prompts with a model on a server, or run MODEL here.\n\n"
        f"{where} One prompt per line, each on its own. At a terminal: Ctrl-C stops a completion, "
        "Ctrl-D or /exit quits.",
    )
    yield CommandSpec(
        name="bench",
        impl="llmp.cli.bench_cmd:app",
        help="Benchmarks: `llmp bench throughput` and `latency` (offline), `llmp bench serve` (a server under load).",
    )
    yield CommandSpec(
        name="pull", impl="llmp.cli.models_cmd:pull", help="Download a model from the Hugging Face Hub, ready to serve."
    )
    yield CommandSpec(name="ls", impl="llmp.cli.models_cmd:ls", help="List the models on this machine.")
    yield CommandSpec(name="rm", impl="llmp.cli.models_cmd:rm", help="Remove a model from the local cache.")
