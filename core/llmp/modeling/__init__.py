"""What every model plugin shares: building blocks on the paged KV cache
(:mod:`llmp.modeling.layers`) and model files (:mod:`llmp.modeling.files`:
Hugging Face directories, safetensors, GGUF)."""
