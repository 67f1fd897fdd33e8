"""What every model plugin shares: building blocks on the paged KV cache
(:mod:`llmp.modeling.layers`, :mod:`llmp.modeling.decoder`, :mod:`llmp.modeling.moe`).
Model files (lookup, GGUF conversion, weights) live in :mod:`llmp.model_files`."""
