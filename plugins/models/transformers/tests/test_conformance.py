"""The conformance kit's model suite on the fallback records, on architectures no native plugin
serves: GPT-2 (learned positions, Conv1D projections), Phi-3 (fused QKV, partial rotary, a sliding
window) and GPT-NeoX (parallel residual, rotary on a quarter of each head) through every engine
path, and a ModernBERT classifier (local and global attention layers)."""

from llmp.conformance import assert_conforms

ARCHITECTURES = ("GPT2LMHeadModel", "Phi3ForCausalLM", "GPTNeoXForCausalLM", "ModernBertForSequenceClassification")


def test_conforms():
    assert_conforms("models-transformers", model_configs={arch: {} for arch in ARCHITECTURES})
