"""llmp plugin: the native BERT encoder for embeddings.

This module only registers; ``model.py`` (which imports torch) loads on selection.
"""

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ModelSpec


@hookimpl
def llmp_register_models() -> Iterator[ModelSpec]:
    yield ModelSpec(
        name="BertModel",
        impl="llmp_models_bert.model:BertModel",
        description="BERT-family encoders (all-MiniLM, BGE, E5 ...) producing embeddings.",
        tasks=("embed",),
    )
