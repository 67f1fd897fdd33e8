"""A model plugin that costs nothing per step: for measuring the server's own overhead."""

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ModelSpec


@hookimpl
def llmp_register_models() -> Iterator[ModelSpec]:
    yield ModelSpec(
        name="NullForCausalLM",
        impl="llmp_bench_null_model.model:NullForCausalLM",
        description="Always predicts token `null_token_id`; no weights, no KV cache.",
    )
