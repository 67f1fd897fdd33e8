"""A GGUF file's quantised matrices stay in their blocks: read from the memory-mapped file (no converted copy),
handed to a kernel set that computes from blocks format by format, dequantised once for one that does not; the
numbers are those transformers reads from the same file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import pytest
import torch
from llmp_kernels_torch.kernels import TorchKernels

from llmp import LLM, hookimpl
from llmp.api import KernelSetSpec
from llmp.model_files.gguf_tensors import read_tensor_table
from llmp.model_files.lookup import find_model_dir
from llmp.model_files.weights import iter_weights
from llmp.quantization import QuantizedWeight, matmul_reference
from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, registered, save_tiny_gguf

Q = gguf.GGMLQuantizationType
WHOLE_K_BLOCKS = {"hidden_size": 256, "intermediate_size": 512}  # rows of whole 256-weight blocks: k-quantised
MIXED = {"attn_v": Q.Q6_K, "ffn_down": Q.Q8_0, "attn_k": Q.Q5_0}  # as a Q4_K_M file mixes them, the rest Q4_K


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def transformers_model(path: Path) -> torch.nn.Module:
    """Transformers' float32 model of the GGUF file at ``path`` (its weights dequantised)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


@pytest.mark.parametrize("architecture", ["llama", "qwen3", "gemma2"])
def test_quantised_matrices_come_in_their_blocks_and_are_the_numbers_transformers_reads(tmp_path, architecture):
    path = tmp_path / f"{architecture}.gguf"
    save_tiny_gguf(path, architecture=architecture, tensor_type=Q.Q4_K, tensor_types=MIXED, **WHOLE_K_BLOCKS)
    model_dir = find_model_dir(str(path))
    assert not list(model_dir.glob("*.safetensors"))  # no converted copy of the weights
    expected = transformers_model(path).state_dict()
    loaded = dict(iter_weights(model_dir, quantized=True))
    formats = {}
    for name, weight in loaded.items():
        if isinstance(weight, QuantizedWeight):
            formats[name] = weight.format.name
            assert torch.equal(weight.dequantize(), expected[name]), name  # llama's q/k rows back in place
        else:
            assert torch.equal(weight, expected[name]), name  # Gemma's norms less one
    layer = "model.layers.0."
    assert formats[layer + "self_attn.q_proj.weight"] == "Q4_K"
    assert formats[layer + "self_attn.k_proj.weight"] == "Q5_0"
    assert formats[layer + "self_attn.v_proj.weight"] == "Q6_K"
    assert formats[layer + "mlp.down_proj.weight"] == "Q8_0"
    # rows in file order are views of the memory-mapped file, no copy: as far apart in memory as in the file
    with open(path, "rb") as f:
        offsets = {t.name: t.offset for t in read_tensor_table(f.read())}
    v, down = (loaded[layer + name].blocks.data_ptr() for name in ("self_attn.v_proj.weight", "mlp.down_proj.weight"))
    assert v - down == offsets["blk.0.attn_v.weight"] - offsets["blk.0.ffn_down.weight"]


def test_without_quantized_every_tensor_comes_dequantised(tmp_path):
    path = tmp_path / "q8.gguf"
    save_tiny_gguf(path, tensor_type=Q.Q8_0)
    weights = list(iter_weights(find_model_dir(str(path))))
    assert weights and all(isinstance(w, torch.Tensor) for _, w in weights)


class BlockKernels(TorchKernels):
    """The torch set computing Q4_K and Q6_K from their blocks (the reference matmul, each call); no other format."""

    name = "blocks"
    packed: list[tuple[str, int]] = []

    def pack_quantized(self, weight: QuantizedWeight) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if weight.format.name not in ("Q4_K", "Q6_K"):
            return None
        BlockKernels.packed.append((weight.format.name, weight.out_features))
        return lambda x: matmul_reference(x, weight.blocks, weight.format)


class BlockKernelsPlugin:
    @hookimpl
    def llmp_register_kernels(self) -> Iterator[KernelSetSpec]:
        yield KernelSetSpec(name="blocks", impl=f"{__name__}:BlockKernels", devices=("cpu",))


def test_a_kernel_set_gets_each_formats_rows_and_greedy_output_is_transformers(tmp_path, caplog):
    path = tmp_path / "mixed.gguf"
    written = save_tiny_gguf(path, tensor_type=Q.Q4_K, tensor_types=MIXED, seed=3, qk_scale=4.0, **WHOLE_K_BLOCKS)
    prompts = mixed_prompts(3, seed=4)
    BlockKernels.packed.clear()
    with registered(BlockKernelsPlugin()), caplog.at_level("INFO", logger="llmp.engine"):
        got, llm = engine_greedy(path, prompts, max_tokens=8, kernels="blocks")
    config = written.config
    layers, kv_rows = config.num_hidden_layers, config.num_key_value_heads * config.head_dim
    # a fused q|k|v of Q4_K, Q5_0 and Q6_K rows: the set computes q's and v's blocks, k's rows are dequantised
    assert BlockKernels.packed.count(("Q6_K", kv_rows)) == layers
    assert BlockKernels.packed.count(("Q4_K", config.hidden_size)) == 2 * layers  # q (its own part), o
    assert ("Q5_0", kv_rows) not in BlockKernels.packed
    model = llm.engine.executor.runner.model
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.numel() == 0 and qkv.packed_row_invariant  # no dense copy, no row padding
    assert "computed in their blocks by kernel set 'blocks'" in caplog.text
    assert "dequantised to float32 (kernel set 'blocks' does not compute them)" in caplog.text
    assert_greedy_parity(transformers_model(path), prompts, got, max_tokens=8)


def test_the_start_up_line_names_the_files_quantisation(tmp_path, caplog):
    path = tmp_path / "q8.gguf"
    save_tiny_gguf(path, tensor_type=Q.Q8_0, file_type=7)
    with caplog.at_level("INFO", logger="llmp.engine"):
        LLM(str(path), dtype="float32")
    assert f"model {path} (GGUF Q8_0), dtype float32" in caplog.text


def test_a_truncated_file_is_one_line_naming_the_tensor(tmp_path):
    path = tmp_path / "q8.gguf"
    save_tiny_gguf(path, tensor_type=Q.Q8_0)
    model_dir = find_model_dir(str(path))
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)
    from llmp.api import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"GGUF tensor \S+ runs past the end of the file: is it truncated\?"):
        list(iter_weights(model_dir, quantized=True))
