"""paged_attention against the torch reference set: values over the engine's shapes, batch invariance bit for bit
(alone, batched, chunked, any thread count), every ISA path, and clear errors."""

from __future__ import annotations

import dataclasses
import os
import textwrap

import pytest
import torch
from llmp_kernels_cpu_native.kernels import NativeKernels
from llmp_kernels_torch.kernels import TorchKernels

from llmp.api import AttentionMetadata

SCALE = 0.125


@pytest.fixture(scope="module")
def kernels() -> NativeKernels:
    return NativeKernels()


class Cache:
    """A paged cache with random keys and values; each request's blocks scattered over it in random order."""

    def __init__(self, seq_lens, heads=9, kv_heads=3, head_dim=64, block_size=16, dtype=torch.float32, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.block_size, self.heads, self.head_dim, self.dtype = block_size, heads, head_dim, dtype
        per_request = max(-(-n // block_size) for n in seq_lens)
        blocks = len(seq_lens) * per_request + 3
        shape = (blocks, block_size, kv_heads, head_dim)
        self.k = torch.randn(shape, generator=generator).to(dtype)
        self.v = torch.randn(shape, generator=generator).to(dtype)
        order = torch.randperm(blocks, generator=generator)[: len(seq_lens) * per_request]
        self.tables = order.view(len(seq_lens), per_request).int()
        self.queries = torch.randn(max(seq_lens), heads, head_dim, generator=generator).to(dtype)

    def batch(self, requests, window=None):
        """q and metadata for requests [(request index, first new position, new tokens)]: request i's query at
        position p is always the same vector, so one position can be compared across batches."""
        q = torch.cat([self.queries[start : start + new] for _, start, new in requests])
        lens = [new for *_, new in requests]
        metadata = AttentionMetadata(
            query_start_loc=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32),
            seq_lens=torch.tensor([start + new for _, start, new in requests], dtype=torch.int32),
            block_tables=self.tables[[i for i, *_ in requests]].contiguous(),
            slot_mapping=torch.full((q.shape[0],), -1, dtype=torch.long),
            max_query_len=max(lens),
            max_seq_len=max(start + new for _, start, new in requests),
            sliding_window=window,
        )
        return q, metadata


MIXED = [(0, 0, 37), (1, 40, 1), (2, 100, 29), (3, 16, 1), (4, 0, 1)]  # prefill, decode, chunk on a cached prefix
SEQ_LENS = [37, 41, 129, 17, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "heads, kv_heads, head_dim, block_size",
    [(9, 3, 64, 16), (14, 2, 64, 16), (4, 4, 40, 8), (8, 1, 256, 32), (6, 2, 24, 5)],
)
@pytest.mark.parametrize("window, softcap", [(None, None), (20, None), (None, 30.0), (7, 50.0)])
def test_matches_the_reference(kernels, dtype, heads, kv_heads, head_dim, block_size, window, softcap):
    cache = Cache(SEQ_LENS, heads, kv_heads, head_dim, block_size, dtype)
    q, metadata = cache.batch(MIXED, window)
    got = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE, softcap)
    # the reference in float32 (its bfloat16 SDPA rounds more than this kernel's float32 arithmetic)
    expected = TorchKernels().paged_attention(q.float(), cache.k.float(), cache.v.float(), metadata, SCALE, softcap)
    assert got.dtype == dtype and got.shape == q.shape
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # float32 summation order; one rounding to dtype
    torch.testing.assert_close(got.float(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim, window, softcap", [(64, None, None), (40, 20, 30.0), (20, None, None)])
def test_float32_queries_over_a_16_bit_cache_match_the_reference(kernels, cache_dtype, head_dim, window, softcap):
    # --kv-cache-dtype bfloat16/float16 of a float32 model: the cache's values widen exactly, the rest is float32
    cache = Cache(SEQ_LENS, 8, 2, head_dim, 16, cache_dtype, seed=3)
    q, metadata = cache.batch(MIXED, window)
    q = q.float()
    got = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE, softcap)
    expected = TorchKernels().paged_attention(q, cache.k.float(), cache.v.float(), metadata, SCALE, softcap)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # and the same bits as over the float32 copy of the cache (the same values, read another way)
    assert torch.equal(got, kernels.paged_attention(q, cache.k.float(), cache.v.float(), metadata, SCALE, softcap))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window, softcap", [(None, None), (20, 30.0)])
def test_a_position_has_the_same_bits_alone_batched_and_chunked(kernels, dtype, window, softcap):
    cache = Cache([130, 130, 64], dtype=dtype)

    def attend(requests):
        q, metadata = cache.batch(requests, window)
        out = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE, softcap)
        rows, at = {}, 0
        for index, start, new in requests:
            for position in range(start, start + new):
                rows[index, position] = out[at]
                at += 1
        return rows

    whole = attend([(0, 0, 130)])  # one prefill
    chunked = {}
    for requests in ([(0, 0, 17)], [(1, 0, 64), (0, 17, 50)], [(0, 67, 1), (2, 0, 64)], [(0, 68, 62)]):
        chunked.update(attend(requests))
    alone = {(0, p): attend([(0, p, 1)])[0, p] for p in (0, 15, 16, 63, 64, 129)}  # decode steps
    for key, row in {**chunked, **alone}.items():
        if key[0] == 0:
            assert torch.equal(row, whole[key]), key


def test_the_result_does_not_depend_on_the_thread_count(kernels, set_threads):
    cache = Cache(SEQ_LENS, 14, 2, 64, 16, torch.bfloat16)
    q, metadata = cache.batch(MIXED)
    set_threads(1)
    alone = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE)
    for count in (2, 3):
        set_threads(count)
        assert torch.equal(kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE), alone)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_items_taken_from_a_thread_that_fell_behind_keep_their_bits(kernels, set_threads, dtype):
    # more threads than cores: some are descheduled mid-call, and the others take what is left of their items
    # (csrc/unit_range.h); each must still be attended once, whole, as its owner would
    seq_lens = [300 + 7 * i for i in range(24)]
    cache = Cache(seq_lens, 14, 2, 64, 16, dtype, seed=5)
    q, metadata = cache.batch([(i, n - 1, 1) for i, n in enumerate(seq_lens)])
    set_threads(1)
    alone = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE)
    set_threads(3 * (os.cpu_count() or 1) + 3)
    for _ in range(10):
        assert torch.equal(kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE), alone)


# Long contexts: a row's keys over several 512-key partitions, merged in order; a call of few items over them runs a
# unit a partition on each thread (csrc/paged_attention_impl.h)
LONG_SEQ_LENS = [1300, 1030, 530]
LONG = [(0, 1299, 1), (1, 500, 530), (2, 529, 1)]  # decodes over 3 and 2 partitions, a prefill chunk across 512


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window, softcap", [(None, None), (600, None), (700, 30.0)])
def test_long_contexts_match_the_reference(kernels, set_threads, dtype, window, softcap):
    cache = Cache(LONG_SEQ_LENS, 9, 3, 64, 16, dtype, seed=6)
    q, metadata = cache.batch(LONG, window)
    expected = TorchKernels().paged_attention(q.float(), cache.k.float(), cache.v.float(), metadata, SCALE, softcap)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    for threads in (1, 2):
        set_threads(threads)
        got = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE, softcap)
        torch.testing.assert_close(got.float(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 600])
def test_a_long_decode_has_the_same_bits_split_over_threads_batched_and_prefilled(kernels, set_threads, dtype, window):
    cache = Cache([1300] * 20, 9, 3, 64, 16, dtype, seed=7)
    q, metadata = cache.batch([(0, 0, 1300)], window)  # the whole prompt at once: items of positions, unsplit
    prefilled = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE)
    q, metadata = cache.batch([(i, 1299, 1) for i in range(20)], window)  # 60 items: whole, unsplit
    batched = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE)[0]
    for threads in (1, 2, 3, 5):
        set_threads(threads)  # one thread: the partitions in turn; more: a unit a partition, merged by the last
        q, metadata = cache.batch([(0, 1299, 1)], window)
        alone = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE)[0]
        assert torch.equal(alone, batched), threads
        assert torch.equal(alone, prefilled[1299]), threads


@pytest.mark.parametrize(
    "heads, kv_heads, head_dim",
    [(14, 2, 64), (28, 4, 128), (32, 4, 128), (16, 4, 80), (12, 6, 96), (8, 8, 128), (8, 4, 256)],
)
def test_bfloat16_over_the_shapes_in_use(kernels, heads, kv_heads, head_dim):
    # bfloat16 takes its own path on AVX-512 BF16 CPUs (vdpbf16ps pairs, tiles of 32 keys): GQA ratios 7, 8, 4,
    # 2, 1; contexts on each side of a 32-key tile and of a 16-token block; prefill chunks and decode tokens
    seq_lens = [31, 32, 33, 65, 97, 1, 200]
    cache = Cache(seq_lens, heads, kv_heads, head_dim, 16, torch.bfloat16, seed=3)
    requests = [(0, 30, 1), (1, 0, 32), (2, 32, 1), (3, 20, 45), (4, 96, 1), (5, 0, 1), (6, 150, 50)]
    for window, softcap in ((None, None), (40, 30.0)):
        q, metadata = cache.batch(requests, window)
        got = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE, softcap)
        expected = TorchKernels().paged_attention(q.float(), cache.k.float(), cache.v.float(), metadata, SCALE, softcap)
        torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2)


def test_a_decode_batch_of_64(kernels):
    cache = Cache([100 + 7 * i for i in range(64)], 14, 2, 64, 16, torch.bfloat16, seed=4)
    requests = [(i, 99 + 7 * i, 1) for i in range(64)]
    q, metadata = cache.batch(requests)
    got = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE)
    expected = TorchKernels().paged_attention(q.float(), cache.k.float(), cache.v.float(), metadata, SCALE)
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2)
    for i in (0, 31, 63):  # each row as it is alone
        q1, one = cache.batch([requests[i]])
        assert torch.equal(kernels.paged_attention(q1, cache.k, cache.v, one, SCALE), got[i : i + 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_query_view_of_a_fused_projection(kernels, dtype):
    # q as models pass it: a view of the q|k|v projection, rows not contiguous
    cache = Cache(SEQ_LENS, dtype=dtype)
    q, metadata = cache.batch(MIXED)
    fused = torch.cat([q.reshape(q.shape[0], -1), torch.randn(q.shape[0], 2 * 3 * 64).to(dtype)], dim=1)
    view = fused[:, : q[0].numel()].view(q.shape)
    assert not view.is_contiguous()
    assert torch.equal(
        kernels.paged_attention(view, cache.k, cache.v, metadata, SCALE),
        kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE),
    )


def test_bad_input_is_a_clear_error(kernels):
    cache = Cache(SEQ_LENS)
    q, metadata = cache.batch(MIXED)
    with pytest.raises(RuntimeError, match="do not group"):
        kernels.paged_attention(q[:, :8], cache.k, cache.v, metadata, SCALE)
    short = dataclasses.replace(metadata, block_tables=metadata.block_tables[:, :1].contiguous())
    with pytest.raises(RuntimeError, match="block table is too short"):
        kernels.paged_attention(q, cache.k, cache.v, short, SCALE)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        kernels.paged_attention(q.double(), cache.k, cache.v, metadata, SCALE)


# -- each instruction set path, forced in a fresh process -------------------------------------------------

ISAS = ("scalar", "avx2", "avx512")

CHECK_PATH = textwrap.dedent(
    """
    import sys
    import torch
    from llmp_kernels_cpu_native.kernels import NativeKernels
    from llmp_kernels_torch.kernels import TorchKernels
    sys.path.insert(0, sys.argv[2])
    from test_paged_attention import LONG, LONG_SEQ_LENS, MIXED, SCALE, SEQ_LENS, Cache

    kernels = NativeKernels()
    assert kernels.isa == sys.argv[1], kernels.isa
    # bfloat16 in vdpbf16ps pairs exactly where the AVX-512 loops run on a CPU with AVX-512 BF16
    with open("/proc/cpuinfo") as cpuinfo:
        bf16_cpu = "avx512_bf16" in cpuinfo.read()
    assert torch.ops.llmp_native.paged_attention_pairs() == (sys.argv[1] == "avx512" and bf16_cpu)
    for dtype in (torch.float32, torch.bfloat16):
        cache = Cache(SEQ_LENS, 14, 2, 64, 16, dtype)
        for window, softcap in ((None, None), (20, 30.0)):
            q, metadata = cache.batch(MIXED, window)
            got = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE, softcap)
            ref = TorchKernels().paged_attention(q.float(), cache.k.float(), cache.v.float(), metadata, SCALE, softcap)
            tolerance = 1e-5 if dtype == torch.float32 else 1e-2
            torch.testing.assert_close(got.float(), ref, rtol=tolerance, atol=tolerance)
            q1, one = cache.batch([MIXED[2]], window)
            alone = kernels.paged_attention(q1, cache.k, cache.v, one, SCALE, softcap)
            assert torch.equal(alone, got[38:67]), (dtype, window)
        cache = Cache(LONG_SEQ_LENS, 9, 3, 64, 16, dtype, seed=6)  # partitions, split over threads or not
        q, metadata = cache.batch(LONG, 600)
        ref = TorchKernels().paged_attention(q.float(), cache.k.float(), cache.v.float(), metadata, SCALE)
        torch.testing.assert_close(kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE).float(), ref,
                                   rtol=tolerance, atol=tolerance)
        q, metadata = cache.batch([LONG[0], LONG[2]], 600)  # 6 items: on 3 threads, a unit a partition
        torch.set_num_threads(1)
        alone = kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE)
        torch.set_num_threads(3)
        assert torch.equal(kernels.paged_attention(q, cache.k, cache.v, metadata, SCALE), alone), dtype
    print("ok")
    """
)


@pytest.mark.parametrize("isa", ISAS)
def test_each_instruction_set_path(isa, run_on_isa):
    run_on_isa(isa, CHECK_PATH, os.path.dirname(__file__))
