"""decoder_layer (a decode step's decoder layer in one call and one OpenMP region) against the set's own ops called
one at a time: the same bits of the output, the residual and the KV cache over the shapes in use (GQA ratios, head
sizes, biases, sliding windows, soft-capping, batches, thread counts), the first layer without a residual, clear
errors that leave no thread behind, and which layers the set takes (``pack_decoder_layer``). On an AVX-512 BF16 CPU the
whole file runs again with LLMP_NATIVE_ISA=avx2, where the products take the pairs' AVX2 form."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from llmp_kernels_cpu_native.kernels import DenseGatedLinear, DenseLinear, FusedDecoderLayer, NativeKernels
from llmp_kernels_cpu_native.library import dense_on_pairs, dense_path, dense_supported

from llmp.api import AttentionMetadata, DecoderLayerParts

pytestmark = pytest.mark.skipif(
    not dense_supported() or not dense_on_pairs(), reason="decoder_layer multiplies on the pairs only (not AMX tiles)"
)
BF16 = torch.bfloat16
EPS = 1e-5


class Layer:
    """A decoder layer's weights packed by the set, a paged cache with random contents, and a decode step of
    ``len(seq_lens)`` requests (one new token each) over it."""

    def __init__(
        self,
        seq_lens,
        hidden=576,
        heads=9,
        kv_heads=3,
        head_dim=64,
        intermediate=1536,
        bias=False,
        window=None,
        softcap=None,
        block_size=16,
        seed=0,
    ):
        generator = torch.Generator().manual_seed(seed)

        def rand(*shape, scale=1.0):
            return (torch.randn(*shape, generator=generator) * scale).to(BF16)

        kernels = NativeKernels()
        width = (heads + 2 * kv_heads) * head_dim
        self.qkv = kernels.pack_linear(rand(width, hidden, scale=0.05), rand(width) if bias else None)
        self.o = kernels.pack_linear(rand(hidden, heads * head_dim, scale=0.05), None)
        _, self.gated = kernels.pack_gated_linear(
            rand(2 * intermediate, hidden, scale=0.05), rand(2 * intermediate) if bias else None, "silu"
        )
        self.down = kernels.pack_linear(rand(hidden, intermediate, scale=0.05), None)
        self.parts = DecoderLayerParts(
            input_norm=rand(hidden) + 1,
            post_attention_norm=rand(hidden) + 1,
            eps=EPS,
            qkv=self.qkv,
            o=self.o,
            gate_up_act=self.gated,
            down=self.down,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            scale=head_dim**-0.5,
            softcap=softcap,
            sliding_window=window,
        )
        self.kernels, self.heads, self.kv_heads, self.head_dim = kernels, heads, kv_heads, head_dim
        rows = len(seq_lens)
        per_request = max(-(-n // block_size) for n in seq_lens)
        blocks = rows * per_request + 2
        self.k_cache = rand(blocks, block_size, kv_heads, head_dim)
        self.v_cache = rand(blocks, block_size, kv_heads, head_dim)
        tables = torch.randperm(blocks, generator=generator)[: rows * per_request].view(rows, per_request)
        positions = torch.tensor(seq_lens) - 1
        slots = tables[torch.arange(rows), positions // block_size] * block_size + positions % block_size
        self.positions = positions
        self.metadata = AttentionMetadata(
            query_start_loc=torch.arange(rows + 1, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=tables.int(),
            slot_mapping=slots,
            max_query_len=1,
            max_seq_len=max(seq_lens),
        )
        self.cos_sin = torch.randn(max(seq_lens) + 8, head_dim, generator=generator)
        self.hidden = rand(rows, hidden)
        self.residual = rand(rows, hidden)

    def one_op_at_a_time(self, residual, k_cache, v_cache):
        """The layer as DecoderLayer's parts compute it with this set."""
        kernels, p, m = self.kernels, self.parts, self.metadata
        if residual is None:
            residual, x = self.hidden, kernels.rms_norm(self.hidden, p.input_norm, EPS)
        else:
            x, residual = kernels.rms_norm(self.hidden, p.input_norm, EPS, residual)
        rows = x.shape[0]
        q, k, v = self.qkv(x).split([p.num_heads * p.head_dim, *[p.num_kv_heads * p.head_dim] * 2], dim=-1)
        q, k = kernels.rotary(
            self.positions, q.reshape(rows, p.num_heads, -1), k.reshape(rows, p.num_kv_heads, -1), self.cos_sin
        )
        v = v.reshape(rows, p.num_kv_heads, -1)
        kernels.write_kv(k, v, k_cache, v_cache, m.slot_mapping)
        if p.sliding_window is not None:
            m = AttentionMetadata(
                *[
                    getattr(m, f)
                    for f in (
                        "query_start_loc",
                        "seq_lens",
                        "block_tables",
                        "slot_mapping",
                        "max_query_len",
                        "max_seq_len",
                    )
                ],
                sliding_window=p.sliding_window,
            )
        attended = kernels.paged_attention(q, k_cache, v_cache, m, p.scale, p.softcap).reshape(rows, -1)
        x, residual = kernels.rms_norm(self.o(attended), p.post_attention_norm, EPS, residual)
        return self.down(self.gated(x)), residual

    def check(self, first=False):
        fused = self.kernels.pack_decoder_layer(self.parts)
        assert isinstance(fused, FusedDecoderLayer)
        residual = None if first else self.residual
        k_parts, v_parts = self.k_cache.clone(), self.v_cache.clone()
        want, want_residual = self.one_op_at_a_time(residual, k_parts, v_parts)
        k_fused, v_fused = self.k_cache.clone(), self.v_cache.clone()
        got, got_residual = fused(self.positions, self.hidden, residual, self.metadata, k_fused, v_fused, self.cos_sin)
        assert torch.equal(got, want) and torch.equal(got_residual, want_residual)
        assert torch.equal(k_fused, k_parts) and torch.equal(v_fused, v_parts)
        assert not torch.equal(k_fused, self.k_cache)  # this step's keys were written


@pytest.mark.parametrize(
    "heads, kv_heads, head_dim", [(9, 3, 64), (14, 2, 64), (8, 8, 64), (8, 4, 80), (12, 2, 128), (16, 2, 256)]
)
@pytest.mark.parametrize("rows", [1, 3, 33])
def test_the_bits_of_the_ops_one_at_a_time(heads, kv_heads, head_dim, rows):
    seq_lens = [17 + 29 * i % 200 for i in range(rows)]  # within a block, across blocks, long
    Layer(seq_lens, hidden=256, heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=320).check()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("window, softcap", [(None, None), (24, None), (None, 30.0), (7, 50.0)])
@pytest.mark.parametrize("first", [False, True])
def test_biases_windows_soft_capping_and_the_first_layer(bias, window, softcap, first):
    Layer([1, 40, 130, 16], bias=bias, window=window, softcap=softcap, seed=3).check(first=first)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_thread_count(set_threads, threads):
    set_threads(threads)
    Layer([5, 77], seed=1).check()


def test_a_decode_batch_of_64():
    Layer([1 + 13 * i % 300 for i in range(64)], hidden=128, heads=4, kv_heads=2, intermediate=256, seed=2).check()


def test_a_failing_part_is_a_clear_error_and_the_next_call_runs(set_threads):
    set_threads(2)
    layer = Layer([20, 50], seed=4)
    fused = layer.kernels.pack_decoder_layer(layer.parts)
    bad = AttentionMetadata(
        layer.metadata.query_start_loc,
        layer.metadata.seq_lens,
        layer.metadata.block_tables,
        torch.tensor([0, 10**9]),  # a slot past the cache: write_kv_ refuses it on the region's first thread
        1,
        50,
    )
    with pytest.raises(RuntimeError, match="slot 1000000000 is outside the cache"):
        fused(layer.positions, layer.hidden, layer.residual, bad, layer.k_cache, layer.v_cache, layer.cos_sin)
    with pytest.raises(RuntimeError, match="block table is too short"):  # refused before the region
        short = AttentionMetadata(
            layer.metadata.query_start_loc,
            layer.metadata.seq_lens,
            layer.metadata.block_tables[:, :1],
            layer.metadata.slot_mapping,
            1,
            50,
        )
        fused(layer.positions, layer.hidden, layer.residual, short, layer.k_cache, layer.v_cache, layer.cos_sin)
    layer.check()


def test_inputs_it_does_not_compute_go_back_to_the_parts():
    layer = Layer([9])
    fused = layer.kernels.pack_decoder_layer(layer.parts)
    args = (layer.positions, layer.hidden, layer.residual, layer.metadata)
    assert fused(*args, layer.k_cache.float(), layer.v_cache.float(), layer.cos_sin) is None  # a float32 cache
    assert fused(*args, layer.k_cache, layer.v_cache, layer.cos_sin[:, :32]) is None  # a partial rotary table
    hidden = layer.hidden.float()
    assert fused(layer.positions, hidden, None, layer.metadata, layer.k_cache, layer.v_cache, layer.cos_sin) is None


def test_only_its_own_packed_products_are_taken():
    layer = Layer([9])
    kernels, parts = layer.kernels, layer.parts
    assert isinstance(parts.qkv, DenseLinear) and isinstance(parts.gate_up_act, DenseGatedLinear)
    other = torch.nn.Linear(576, 576, bias=False).to(BF16)
    for change in (
        {"o": other},  # not this set's product
        {"down": DenseLinear(torch.randn(576, 1536).to(BF16), torch.randn(576).to(BF16))},  # a bias on down
        {"input_norm": parts.input_norm.float()},
        {"gate_up_act": kernels.pack_gated_linear(torch.randn(3072, 576).to(BF16), None, "silu")[0]},  # not gated
    ):
        assert kernels.pack_decoder_layer(DecoderLayerParts(**{**parts.__dict__, **change})) is None


def test_the_whole_file_passes_on_the_avx2_form_too():
    # where the products ran on the vdpbf16ps pairs, every test above again with LLMP_NATIVE_ISA=avx2 (the AVX2
    # form of the pairs, the row kernels' and the attention's AVX2 loops)
    if dense_path() != "avx512-bf16 pairs":
        pytest.skip(f"the file ran on {dense_path()}")
    env = {**os.environ, "LLMP_NATIVE_ISA": "avx2"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", "-p", "no:cacheprovider", __file__]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
