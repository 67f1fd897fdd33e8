"""Quantised weight formats in torch, for kernel and model plugins.

:mod:`llmp.quantization.ggml` holds GGML's block formats (the tensor types of GGUF files): their table,
:func:`dequantize` (bit for bit ``gguf``'s own), :func:`quantize` (for test files) and :func:`matmul_reference`,
the reference a kernel set's quantised matmul is checked against. :class:`QuantizedWeight` is a linear layer's
weight kept in those blocks, as the model loader hands it to layers and to a kernel set's ``pack_quantized``.
"""

from llmp.quantization.ggml import GGML_FORMATS, BlockFormat, dequantize, format_of, matmul_reference, quantize
from llmp.quantization.weight import Int8Activations, QuantizedWeight

__all__ = [
    "GGML_FORMATS",
    "BlockFormat",
    "Int8Activations",
    "QuantizedWeight",
    "dequantize",
    "format_of",
    "matmul_reference",
    "quantize",
]
