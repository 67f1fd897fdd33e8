"""llmp: an LLM inference and serving platform built from plugins.

Importing this package is cheap: it imports no torch, transformers or triton.
Plugin authors import from :mod:`llmp.api` and use :data:`hookimpl`.
"""

from llmp.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]
