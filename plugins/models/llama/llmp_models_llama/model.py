"""``LlamaForCausalLM`` on the paged KV cache: the shared decoder with Llama's options
(bias on the attention projections when ``attention_bias``, on the MLP when ``mlp_bias``), and its
embedding (``LlamaModel``) and classifier / reward model (``LlamaForSequenceClassification``) variants."""

from llmp.modeling.decoder import DecoderForCausalLM, embedding_variant, sequence_classification_variant


class LlamaForCausalLM(DecoderForCausalLM):
    pass


LlamaModel = embedding_variant(LlamaForCausalLM)
LlamaForSequenceClassification = sequence_classification_variant(LlamaForCausalLM)
