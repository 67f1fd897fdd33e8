"""An llmp plugin that adds the `llmp hello` command."""

from llmp import hookimpl
from llmp.api import CommandSpec


@hookimpl
def llmp_register_commands():
    yield CommandSpec(name="hello", impl="llmp_hello:hello", help="Greet someone.")


def hello(name: str = "world") -> None:
    print(f"hello, {name}")
