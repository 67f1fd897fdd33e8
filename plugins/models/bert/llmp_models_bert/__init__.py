"""llmp plugin: native BERT-family encoders (embeddings) and cross-encoders (score, rerank, classify).

This module only registers; ``model.py`` (which imports torch) loads on selection.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ModelSpec

_ENCODERS = {
    "BertModel": "BERT-family encoders (all-MiniLM, BGE, E5 ...) producing embeddings.",
    "RobertaModel": "RoBERTa encoders producing embeddings.",
    "XLMRobertaModel": "XLM-RoBERTa encoders (bge-m3, multilingual-e5 ...) producing embeddings.",
}
_CLASSIFIERS = {
    "BertForSequenceClassification": "BERT cross-encoders and classifiers (ms-marco MiniLM rerankers ...).",
    "RobertaForSequenceClassification": "RoBERTa cross-encoders and classifiers.",
    "XLMRobertaForSequenceClassification": "XLM-RoBERTa cross-encoders and classifiers (bge-reranker ...).",
}


@hookimpl
def llmp_register_models() -> Iterator[ModelSpec]:
    for name, description in _ENCODERS.items():
        yield ModelSpec(name=name, impl=f"llmp_models_bert.model:{name}", description=description, tasks=("embed",))
    for name, description in _CLASSIFIERS.items():
        yield ModelSpec(name=name, impl=f"llmp_models_bert.model:{name}", description=description, tasks=("classify",))
