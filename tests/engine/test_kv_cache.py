"""Model-free tests of BlockKVCacheManager: allocation, prefix caching, ref counts, eviction order."""

from __future__ import annotations

import itertools

import pytest

from llmp.engine.kv_cache import BlockKVCacheManager
from llmp.engine.request import Request
from llmp.sampling_params import SamplingParams

BS = 4  # block size used throughout

_ids = itertools.count()


def req(tokens: list[int], request_id: str | None = None) -> Request:
    rid = request_id if request_id is not None else f"r{next(_ids)}"
    return Request(rid, list(tokens), SamplingParams(), eos_token_ids=frozenset({0}), max_tokens=16)


def prefill(kv: BlockKVCacheManager, request: Request) -> tuple[list[int], int]:
    """Do what the scheduler does for a whole-prompt admission; return the prefix hit."""
    blocks, num_cached = kv.get_computed_blocks(request)
    new = kv.allocate_slots(request, request.num_tokens - num_cached, blocks)
    assert new is not None
    request.num_computed_tokens = request.num_tokens
    return blocks, num_cached


def free_order(kv: BlockKVCacheManager) -> list[int]:
    return list(kv.free_blocks)


# -- construction ------------------------------------------------------------


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 4), (4, 0), (-1, 4)])
def test_rejects_non_positive_sizes(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        BlockKVCacheManager(num_blocks, block_size, True)


def test_fresh_manager_is_empty() -> None:
    kv = BlockKVCacheManager(8, BS, True)
    assert kv.num_free_blocks == 8
    assert kv.usage == 0.0
    assert kv.ref_counts == [0] * 8
    assert kv.cached == {}
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (0, 0)


# -- allocation --------------------------------------------------------------


@pytest.mark.parametrize(("num_tokens", "num_blocks"), [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3), (10, 3)])
def test_allocate_gives_ceil_of_tokens_over_block_size(num_tokens: int, num_blocks: int) -> None:
    kv = BlockKVCacheManager(10, BS, True)
    r = req(list(range(1, num_tokens + 1)))
    new = kv.allocate_slots(r, num_tokens)
    assert new is not None and len(new) == num_blocks
    assert r.block_ids == new
    assert len(set(new)) == num_blocks
    assert kv.num_free_blocks == 10 - num_blocks
    assert all(kv.ref_counts[b] == 1 for b in new)
    assert all(b not in kv.free_blocks for b in new)


def test_decode_allocates_a_block_only_when_the_last_one_is_full() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    r = req(list(range(1, 7)))  # 6 tokens -> 2 blocks, 2 free slots in the last
    assert len(kv.allocate_slots(r, 6)) == 2
    r.num_computed_tokens = 6
    grown = []
    for token in (101, 102, 103):
        r.append_token(token)
        new = kv.allocate_slots(r, 1)
        r.num_computed_tokens += 1
        grown.append(len(new))
    # tokens 7 and 8 fit in block 2; token 9 needs block 3
    assert grown == [0, 0, 1]
    assert len(r.block_ids) == 3
    assert kv.num_free_blocks == 7


def test_allocate_returns_none_and_changes_nothing_when_out_of_blocks() -> None:
    kv = BlockKVCacheManager(3, BS, True)
    a = req(list(range(1, 9)))  # 2 blocks
    prefill(kv, a)
    b = req(list(range(50, 59)))  # 9 tokens -> 3 blocks, only 1 free
    refs, order, cached = list(kv.ref_counts), free_order(kv), dict(kv.cached)
    assert kv.allocate_slots(b, 9) is None
    assert b.block_ids == []
    assert kv.ref_counts == refs
    assert free_order(kv) == order
    assert kv.cached == cached
    assert b.num_registered_blocks == 0


def test_allocate_with_cached_blocks_does_not_count_them_as_free_room() -> None:
    kv = BlockKVCacheManager(3, BS, True)
    a = req(list(range(1, 9)))  # 2 full blocks, cached after free
    prefill(kv, a)
    kv.free(a)
    assert kv.num_free_blocks == 3
    # 13 tokens share 8 with a: 2 cached blocks + 2 new ones, but only 1 block is free beyond the cached two.
    c = req(list(range(1, 9)) + [90, 91, 92, 93, 94])
    blocks, num_cached = kv.get_computed_blocks(c)
    assert num_cached == 8
    refs, order, cached = list(kv.ref_counts), free_order(kv), dict(kv.cached)
    assert kv.allocate_slots(c, c.num_tokens - num_cached, blocks) is None
    assert c.block_ids == []
    assert kv.ref_counts == refs and free_order(kv) == order and kv.cached == cached
    # 11 tokens: 2 cached blocks + 1 new one fits.
    d = req(list(range(1, 9)) + [90, 91, 92])
    blocks, num_cached = kv.get_computed_blocks(d)
    new = kv.allocate_slots(d, d.num_tokens - num_cached, blocks)
    assert new is not None and len(new) == 1
    assert d.block_ids == blocks + new
    assert kv.num_free_blocks == 0


def test_allocation_never_evicts_the_cached_blocks_it_reuses() -> None:
    kv = BlockKVCacheManager(3, BS, True)
    a = req([1, 2, 3, 4, 5, 6, 7, 8])  # 2 cached blocks
    x = req([31, 32, 33, 34])  # 1 cached block
    prefill(kv, a)
    prefill(kv, x)
    a0, a1 = a.block_ids
    (x0,) = x.block_ids
    kv.free(a)
    kv.free(x)
    assert free_order(kv) == [a1, a0, x0]  # a's blocks are at the head, first to be evicted
    d = req([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    blocks, num_cached = kv.get_computed_blocks(d)
    assert blocks == [a0, a1] and num_cached == 8
    assert kv.allocate_slots(d, 3, blocks) == [x0]
    assert d.block_ids == [a0, a1, x0]
    assert kv.cached.get(a.block_hashes[0]) == a0 and kv.cached.get(a.block_hashes[1]) == a1
    assert x.block_hashes[0] not in kv.cached


def test_usage_counts_blocks_in_use() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req(list(range(1, 11)))  # 3 blocks
    prefill(kv, a)
    assert kv.usage == pytest.approx(0.3)
    b = req(list(range(20, 25)))  # 2 blocks
    prefill(kv, b)
    assert kv.usage == pytest.approx(0.5)
    kv.free(a)
    assert kv.usage == pytest.approx(0.2)
    kv.free(b)
    assert kv.usage == 0.0  # cached but unused blocks count as free


# -- prefix caching ----------------------------------------------------------


def test_second_request_reuses_a_two_block_prefix() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req([1, 2, 3, 4, 5, 6, 7, 8, 9])  # 2 full blocks + 1 token
    blocks, num_cached = prefill(kv, a)
    assert (blocks, num_cached) == ([], 0)
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (9, 0)

    b = req([1, 2, 3, 4, 5, 6, 7, 8, 40, 41])  # shares the two full blocks
    blocks, num_cached = kv.get_computed_blocks(b)
    assert blocks == a.block_ids[:2]
    assert num_cached == 8
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (9 + 10, 8)

    new = kv.allocate_slots(b, b.num_tokens - num_cached, blocks)
    assert new is not None and len(new) == 1
    assert b.block_ids[:2] == a.block_ids[:2]
    assert b.block_ids[2] != a.block_ids[2]
    assert [kv.ref_counts[x] for x in a.block_ids] == [2, 2, 1]
    assert kv.ref_counts[b.block_ids[2]] == 1
    assert kv.num_free_blocks == 10 - 4


def test_prefix_hit_stops_at_the_first_differing_block() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req(list(range(1, 13)) + [99])  # 3 full blocks
    prefill(kv, a)
    b = req([1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12, 99])  # block 1 differs, block 2 equal
    blocks, num_cached = kv.get_computed_blocks(b)
    assert blocks == a.block_ids[:1]
    assert num_cached == 4


@pytest.mark.parametrize(("num_tokens", "max_hit_blocks"), [(8, 1), (12, 2), (9, 2), (4, 0)])
def test_at_least_one_token_is_left_to_compute(num_tokens: int, max_hit_blocks: int) -> None:
    kv = BlockKVCacheManager(10, BS, True)
    prompt = list(range(1, num_tokens + 1))
    a = req(prompt)
    prefill(kv, a)
    b = req(prompt)  # the very same prompt, all of it cached
    blocks, num_cached = kv.get_computed_blocks(b)
    assert len(blocks) == max_hit_blocks
    assert num_cached == max_hit_blocks * BS
    assert num_cached < b.num_tokens


def test_shared_blocks_survive_freeing_one_owner() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    prefill(kv, a)
    b = req([1, 2, 3, 4, 5, 6, 7, 8, 30, 31])
    prefill(kv, b)
    shared, a_tail, b_tail = a.block_ids[:2], a.block_ids[2], b.block_ids[2]
    assert kv.num_free_blocks == 6

    kv.free(a)
    assert a.block_ids == [] and a.num_registered_blocks == 0
    assert [kv.ref_counts[x] for x in shared] == [1, 1]
    assert all(x not in kv.free_blocks for x in shared)
    assert kv.ref_counts[a_tail] == 0 and a_tail in kv.free_blocks
    assert kv.num_free_blocks == 7
    assert b.block_ids[:2] == shared and kv.ref_counts[b_tail] == 1

    kv.free(b)
    assert kv.ref_counts == [0] * 10
    assert kv.num_free_blocks == 10


def test_freed_cached_blocks_stay_findable_until_evicted() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    prefill(kv, a)
    first_two = a.block_ids[:2]
    kv.free(a)
    assert kv.num_free_blocks == 10
    assert all(kv.block_hash[x] is not None for x in first_two)

    c = req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    blocks, num_cached = kv.get_computed_blocks(c)
    assert blocks == first_two and num_cached == 8
    new = kv.allocate_slots(c, 1, blocks)
    assert new is not None and len(new) == 1
    # the reused blocks left the free list and are owned again
    assert all(x not in kv.free_blocks for x in first_two)
    assert [kv.ref_counts[x] for x in first_two] == [1, 1]
    assert kv.num_free_blocks == 7


def test_partial_last_block_is_not_cached() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req([1, 2, 3, 4, 5, 6])  # block 1 holds 2 of 4 tokens
    prefill(kv, a)
    assert kv.block_hash[a.block_ids[0]] is not None
    assert kv.block_hash[a.block_ids[1]] is None
    assert len(kv.cached) == 1
    assert a.num_registered_blocks == 1


def test_block_is_cached_once_decode_fills_it() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req([1, 2, 3, 4, 5, 6, 7])
    prefill(kv, a)
    assert len(kv.cached) == 1
    a.append_token(8)  # fills block 1 once computed
    kv.allocate_slots(a, 1)
    a.num_computed_tokens += 1
    assert len(kv.cached) == 2
    assert kv.block_tokens[a.block_ids[1]] == (0, None, (5, 6, 7, 8))  # (lora_id, cache_salt, tokens)
    # a new request with that 8-token prefix (plus one token) now hits both blocks
    b = req([1, 2, 3, 4, 5, 6, 7, 8, 50])
    blocks, _ = kv.get_computed_blocks(b)
    assert blocks == a.block_ids[:2]


def test_hash_collision_with_different_tokens_is_not_a_hit() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    prefill(kv, a)
    hits_before = kv.prefix_cache_hits
    # b's tokens differ, but pretend its block hashes collide with a's.
    b = req([11, 12, 13, 14, 15, 16, 17, 18, 19])
    b.block_hashes = list(a.block_hashes)
    blocks, num_cached = kv.get_computed_blocks(b)
    assert (blocks, num_cached) == ([], 0)
    assert kv.prefix_cache_hits == hits_before


def test_hash_collision_on_a_later_block_stops_the_hit_there() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    prefill(kv, a)
    b = req([1, 2, 3, 4, 60, 61, 62, 63, 9])  # block 0 really equal, block 1 differs
    b.block_hashes = list(a.block_hashes)  # ... but its hash collides
    blocks, num_cached = kv.get_computed_blocks(b)
    assert blocks == a.block_ids[:1]
    assert num_cached == 4


def test_reset_prefix_cache() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    prefill(kv, a)
    assert kv.reset_prefix_cache() is False  # a still holds blocks
    assert len(kv.cached) == 2
    kv.free(a)
    assert kv.reset_prefix_cache() is True
    assert kv.cached == {}
    assert kv.block_hash == [None] * 10
    assert kv.block_tokens == [None] * 10
    assert kv.num_free_blocks == 10
    b = req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert kv.get_computed_blocks(b) == ([], 0)


def test_prefix_caching_disabled_gives_no_hits() -> None:
    kv = BlockKVCacheManager(10, BS, enable_prefix_caching=False)
    a = req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    prefill(kv, a)
    assert kv.cached == {}
    assert kv.block_hash == [None] * 10
    kv.free(a)
    b = req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert kv.get_computed_blocks(b) == ([], 0)
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (0, 0)
    new = kv.allocate_slots(b, 9)
    assert new is not None and len(new) == 3


# -- eviction order ----------------------------------------------------------


def test_least_recently_freed_is_evicted_first_and_tail_before_head() -> None:
    kv = BlockKVCacheManager(4, BS, True)
    a = req([1, 2, 3, 4, 5, 6, 7, 8])  # 2 full blocks
    b = req([21, 22, 23, 24, 25, 26, 27, 28])  # 2 full blocks
    prefill(kv, a)
    prefill(kv, b)
    a0, a1 = a.block_ids
    b0, b1 = b.block_ids
    kv.free(a)
    kv.free(b)
    assert free_order(kv) == [a1, a0, b1, b0]

    # a fresh one-block request evicts a's tail block
    c = req([41, 42, 43, 44])
    assert kv.allocate_slots(c, 4) == [a1]
    assert kv.block_tokens[a1] == (0, None, (41, 42, 43, 44))  # re-registered for c, a's entry dropped
    assert a.block_hashes[1] not in kv.cached
    probe_a = req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert kv.get_computed_blocks(probe_a)[0] == [a0]  # a's head survived
    probe_b = req([21, 22, 23, 24, 25, 26, 27, 28, 29])
    assert kv.get_computed_blocks(probe_b)[0] == [b0, b1]

    # the next eviction takes a's head, and a's prefix is gone
    d = req([61, 62, 63, 64])
    assert kv.allocate_slots(d, 4) == [a0]
    assert kv.get_computed_blocks(req([1, 2, 3, 4, 5, 6, 7, 8, 9]))[0] == []
    assert kv.get_computed_blocks(req([21, 22, 23, 24, 25, 26, 27, 28, 29]))[0] == [b0, b1]


def test_reused_cached_block_moves_to_the_back_of_the_lru() -> None:
    kv = BlockKVCacheManager(4, BS, True)
    a = req([1, 2, 3, 4, 5])  # block a0 cached, a1 partial
    b = req([21, 22, 23, 24, 25])
    prefill(kv, a)
    prefill(kv, b)
    a0, b0 = a.block_ids[0], b.block_ids[0]
    kv.free(a)
    kv.free(b)
    # touch a's prefix again: it becomes the most recently used
    c = req([1, 2, 3, 4, 7])
    prefill(kv, c)
    assert c.block_ids[0] == a0
    kv.free(c)
    order = free_order(kv)
    assert order.index(b0) < order.index(a0)


def test_blocks_without_hash_are_reused_before_cached_ones() -> None:
    kv = BlockKVCacheManager(4, BS, True)
    b = req([21, 22, 23, 24, 25, 26, 27, 28])  # 2 cached blocks
    a = req([1, 2, 3, 4, 5, 6])  # a0 cached, a1 partial (no hash)
    prefill(kv, b)
    prefill(kv, a)
    b0, b1 = b.block_ids
    a0, a1 = a.block_ids
    assert kv.block_hash[a1] is None
    kv.free(b)
    kv.free(a)  # freed last, but its hash-less block must go first
    order = free_order(kv)
    assert order[0] == a1
    assert order.index(b1) < order.index(b0) < order.index(a0)
    c = req([41, 42, 43])
    assert kv.allocate_slots(c, 3) == [a1]
    # no cached prefix was lost
    assert kv.get_computed_blocks(req([21, 22, 23, 24, 25, 26, 27, 28, 29]))[0] == [b0, b1]
    assert kv.get_computed_blocks(req([1, 2, 3, 4, 5]))[0] == [a0]


def test_never_used_blocks_are_taken_before_cached_ones() -> None:
    kv = BlockKVCacheManager(4, BS, True)
    a = req([1, 2, 3, 4, 5])
    prefill(kv, a)
    a0 = a.block_ids[0]
    kv.free(a)
    other = req([31, 32, 33, 34, 35, 36, 37, 38])
    new = kv.allocate_slots(other, 8)
    assert new is not None and a0 not in new
    assert kv.get_computed_blocks(req([1, 2, 3, 4, 5]))[0] == [a0]


def test_evicted_block_forgets_its_hash() -> None:
    kv = BlockKVCacheManager(1, BS, True)
    a = req([1, 2, 3, 4])
    prefill(kv, a)
    (a0,) = a.block_ids
    h = kv.block_hash[a0]
    assert h is not None and kv.cached == {h: a0}
    kv.free(a)
    b = req([9, 9, 9])
    assert kv.allocate_slots(b, 3) == [a0]
    assert kv.cached == {}
    assert kv.block_hash[a0] is None and kv.block_tokens[a0] is None
    assert kv.ref_counts[a0] == 1


# -- chunked prefill ---------------------------------------------------------


def test_chunk_ending_on_a_block_boundary_caches_only_written_blocks() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req(list(range(1, 11)))  # 10 tokens, 2 full blocks
    new = kv.allocate_slots(a, 4)  # first chunk: exactly block 0
    assert len(new) == 1
    assert a.num_registered_blocks == 1
    assert len(kv.cached) == 1


def test_chunk_ending_inside_a_block_does_not_cache_that_block() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = req(list(range(1, 11)))  # 10 tokens, 2 full blocks
    blocks, num_cached = kv.get_computed_blocks(a)  # as the scheduler does before allocating
    assert (blocks, num_cached) == ([], 0)
    new = kv.allocate_slots(a, 5, blocks)  # first chunk: tokens 0..4, block 1 holds only token 4
    a.num_computed_tokens = 5
    assert len(new) == 2
    assert kv.block_hash[a.block_ids[1]] is None
    assert a.num_registered_blocks == 1
    # a second request with the same prompt must not be told tokens 5..7 are in the cache
    kv.free(a)
    b = req(list(range(1, 11)))
    _, num_cached = kv.get_computed_blocks(b)
    assert num_cached <= 4


# -- LoRA adapters -----------------------------------------------------------


def adapter_req(tokens: list[int], lora_id: int) -> Request:
    request = req(tokens)
    request.lora_id = lora_id
    return request


def test_the_same_adapter_shares_blocks_another_adapter_does_not() -> None:
    kv = BlockKVCacheManager(20, BS, True)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    a = adapter_req(prompt, 1)
    prefill(kv, a)
    assert kv.get_computed_blocks(adapter_req(prompt, 1)) == (a.block_ids[:2], 8)
    b, base = adapter_req(prompt, 2), req(prompt)
    assert kv.get_computed_blocks(b) == ([], 0)
    assert kv.get_computed_blocks(base) == ([], 0)  # the base model's chain is its own too
    assert len({tuple(a.block_hashes), tuple(b.block_hashes), tuple(base.block_hashes)}) == 3


def test_an_adapter_never_takes_the_base_models_blocks() -> None:
    kv = BlockKVCacheManager(20, BS, True)
    base = req([1, 2, 3, 4, 5, 6, 7, 8, 9])
    prefill(kv, base)
    a = adapter_req([1, 2, 3, 4, 5, 6, 7, 8, 9], 3)
    assert prefill(kv, a) == ([], 0)
    assert not set(a.block_ids) & set(base.block_ids)


def test_a_hash_collision_across_adapters_is_not_a_hit() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = adapter_req([1, 2, 3, 4, 5, 6, 7, 8, 9], 1)
    prefill(kv, a)
    b = adapter_req([1, 2, 3, 4, 5, 6, 7, 8, 9], 2)
    b.block_hashes = list(a.block_hashes)  # same tokens, and pretend the hashes collide
    assert kv.get_computed_blocks(b) == ([], 0)


# -- cache salts (vLLM's cache_salt) -------------------------------------------


def salted_req(tokens: list[int], salt: str | None, lora_id: int = 0) -> Request:
    request = adapter_req(tokens, lora_id)
    request.cache_salt = salt
    return request


def test_the_same_salt_shares_blocks_another_salt_or_none_does_not() -> None:
    kv = BlockKVCacheManager(30, BS, True)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    a = salted_req(prompt, "tenant-a")
    prefill(kv, a)
    assert kv.get_computed_blocks(salted_req(prompt, "tenant-a")) == (a.block_ids[:2], 8)
    assert kv.get_computed_blocks(salted_req(prompt, "tenant-b")) == ([], 0)
    assert kv.get_computed_blocks(req(prompt)) == ([], 0)  # unsalted prompts never see a salted one's blocks
    plain = req(prompt)
    prefill(kv, plain)
    assert kv.get_computed_blocks(salted_req(prompt, "tenant-b")) == ([], 0)  # nor the other way round
    assert kv.get_computed_blocks(salted_req(prompt, "tenant-a", lora_id=1)) == ([], 0)  # salt and adapter both key


def test_a_hash_collision_across_salts_is_not_a_hit() -> None:
    kv = BlockKVCacheManager(10, BS, True)
    a = salted_req([1, 2, 3, 4, 5, 6, 7, 8, 9], "x")
    prefill(kv, a)
    b = salted_req([1, 2, 3, 4, 5, 6, 7, 8, 9], "y")
    b.block_hashes = list(a.block_hashes)  # same tokens, and pretend the hashes collide
    assert kv.get_computed_blocks(b) == ([], 0)
