"""``LlamaForCausalLM`` on the paged KV cache: the shared decoder with Llama's options
(bias on the attention projections when ``attention_bias``, on the MLP when ``mlp_bias``)."""

from llmp.modeling.decoder import DecoderForCausalLM, embedding_variant


class LlamaForCausalLM(DecoderForCausalLM):
    pass


LlamaModel = embedding_variant(LlamaForCausalLM)
