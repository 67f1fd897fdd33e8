"""Built-in commands: ``llmp plugins`` and ``llmp collect-env``."""

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import CommandSpec


@hookimpl
def llmp_register_commands() -> Iterator[CommandSpec]:
    yield CommandSpec(name="plugins", impl="llmp.cli.plugins_cmd:app", help="List and inspect plugins.")
    yield CommandSpec(
        name="collect-env", impl="llmp.cli.env_cmd:collect_env", help="Report versions, hardware and plugins."
    )
