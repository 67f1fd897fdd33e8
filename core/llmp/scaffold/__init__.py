"""``llmp plugins new KIND NAME``: a complete plugin distribution of each kind, written from templates.

(Contract; built by the scaffold part of issue 30.)
"""

from __future__ import annotations

from pathlib import Path

from llmp.api import LLMPError

__all__ = ["ScaffoldError", "new_plugin"]


class ScaffoldError(LLMPError):
    """A name or directory ``plugins new`` refuses; the message is one line naming the fix."""


def new_plugin(kind: str, name: str, directory: str | Path | None = None) -> Path:
    """Write the distribution ``llmp-NAME`` providing one component of ``kind`` into ``directory``
    (default ``./llmp-NAME``) and return its path. Refuses an invalid name and a directory that
    exists and is not empty."""
    raise ScaffoldError("not built yet")
