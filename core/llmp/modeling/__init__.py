"""What every model plugin builds on: network pieces on the paged KV cache, tensor-parallel ready.

- :mod:`llmp.modeling.decoder`: ``DecoderForCausalLM``, a Llama-shaped decoder whose
  ``make_attention``/``make_mlp``/``make_norm``/``make_layer`` a family overrides, and
  ``embedding_variant`` (the same network as an embedding model);
- :mod:`llmp.modeling.layers`: norms, rotary embeddings, ``PagedAttention``, the
  tensor-parallel linear and embedding layers, ``GatedMLP``, ``CausalLM`` and ``load_weights``;
- :mod:`llmp.modeling.moe`: ``FusedExperts`` and ``SparseMoE``;
- :mod:`llmp.modeling.parallel`: the tensor-parallel group (``tp_rank``, ``tp_size``, collectives);
- :mod:`llmp.modeling.rope`: rotary tables; :mod:`llmp.modeling.pooling`: pooling for embeddings.

Importing this package is cheap; its submodules import torch. Model files (lookup, GGUF
conversion, weights) are the kernel's business (``llmp.model_files``), not a model's.
"""

__all__ = ["decoder", "layers", "moe", "parallel", "pooling", "rope"]
