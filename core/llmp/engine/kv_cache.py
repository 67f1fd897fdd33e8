"""The default KV-cache manager: fixed-size blocks with automatic prefix caching.

A full block is identified by a hash chained over its parent's hash and its
token ids, so equal hashes mean equal prefixes. Blocks whose reference count
drops to zero keep their hash and go to the tail of an LRU free list; they are
reused from the head, which evicts the least recently used cached block first.

Blocks are keyed by LoRA adapter and cache salt too: the chain of a request with an adapter
or a salt starts from ``("lora", Request.lora_id, Request.cache_salt)``, and a cached block's
guard holds both, so two adapters (or an adapter and the base model), or two salts (or a salt
and none), never share a block, even on a hash collision.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from llmp.engine.request import Request


class BlockKVCacheManager:
    supports_lora = True  # keys blocks by Request.lora_id (the engine refuses LoRA with a manager without it)
    supports_cache_salt = True  # and by Request.cache_salt (the engine refuses salted prompts without it)

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        # (lora_id, cache_salt, token ids) of each cached block: guards against hash collisions
        self.block_tokens: list[tuple[int, str | None, tuple[int, ...]] | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # head = evict first
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # of which found in the cache

    # -- figures ---------------------------------------------------------

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_blocks) / self.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    # -- prefix cache ----------------------------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The longest cached prefix of the request, as blocks and a token count.

        At least one token is always left to compute, so the step yields logits.
        Nothing for a pooling request that needs every prompt row (``Request.whole_prompt``).
        """
        if not self.enable_prefix_caching or request.params.prompt_logprobs is not None or request.whole_prompt:
            return [], 0  # prompt logprobs and whole-prompt poolers need every prompt position computed
        self._hash_full_blocks(request, request.num_tokens)
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks: list[int] = []
        for i, block_hash in enumerate(request.block_hashes[:max_blocks]):
            block = self.cached.get(block_hash)
            if block is None or self.block_tokens[block] != self._block_key(request, i):
                break
            blocks.append(block)
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += len(blocks) * self.block_size
        return blocks, len(blocks) * self.block_size

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block no request uses; False if some are in use."""
        if len(self.free_blocks) != self.num_blocks:
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        self.block_tokens = [None] * self.num_blocks
        return True

    # -- allocation ------------------------------------------------------

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_blocks: Sequence[int] = ()
    ) -> list[int] | None:
        """Give the request room for ``num_new_tokens`` more tokens.

        ``computed_blocks`` (from :meth:`get_computed_blocks`) are taken first.
        Returns the newly allocated blocks, or ``None`` (changing nothing) when
        the free list is too short.
        """
        total = request.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
        needed = -(-total // self.block_size) - len(request.block_ids) - len(computed_blocks)
        reusable = sum(1 for b in computed_blocks if self.ref_counts[b] == 0)
        if needed > len(self.free_blocks) - reusable:
            return None
        for block in computed_blocks:
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]
            self.ref_counts[block] += 1
        request.block_ids.extend(computed_blocks)
        new_blocks = [self._pop_free_block() for _ in range(max(needed, 0))]
        request.block_ids.extend(new_blocks)
        if self.enable_prefix_caching and not request.whole_prompt:  # vLLM's rule for pooling requests
            self._cache_full_blocks(request, total)
        return new_blocks

    def free(self, request: Request) -> None:
        """Release the request's blocks; cached ones stay findable until evicted."""
        # Tail blocks hold the longest, least shareable prefixes: free them first
        # so they are evicted first. Blocks without a hash are useless: evict them before any.
        for block in reversed(request.block_ids):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks[block] = None
                if self.block_hash[block] is None:
                    self.free_blocks.move_to_end(block, last=False)
        request.block_ids = []
        request.num_registered_blocks = 0

    # -- internals -------------------------------------------------------

    def _pop_free_block(self) -> int:
        block, _ = self.free_blocks.popitem(last=False)
        evicted = self.block_hash[block]
        if evicted is not None:
            if self.cached.get(evicted) == block:
                del self.cached[evicted]
            self.block_hash[block] = None
            self.block_tokens[block] = None
        self.ref_counts[block] = 1
        return block

    def _tokens_of(self, request: Request, index: int) -> tuple[int, ...]:
        start = index * self.block_size
        return tuple(request.all_token_ids[start : start + self.block_size])

    def _block_key(self, request: Request, index: int) -> tuple[int, str | None, tuple[int, ...]]:
        return request.lora_id, request.cache_salt, self._tokens_of(request, index)

    def _hash_full_blocks(self, request: Request, num_tokens: int) -> None:
        hashes = request.block_hashes
        # an adapter's or a salt's own chain
        keyed = request.lora_id or request.cache_salt is not None
        first_parent = ("lora", request.lora_id, request.cache_salt) if keyed else None
        for i in range(len(hashes), num_tokens // self.block_size):
            parent = hashes[i - 1] if i else first_parent
            hashes.append(hash((parent, self._tokens_of(request, i))))

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        # Register blocks that are full once this step's tokens are written.
        written = min(num_tokens, request.num_tokens) // self.block_size  # full once this step is done
        self._hash_full_blocks(request, written * self.block_size)
        for i in range(request.num_registered_blocks, min(written, len(request.block_ids))):
            block = request.block_ids[i]
            request.num_registered_blocks = i + 1
            block_hash = request.block_hashes[i]
            if self.block_hash[block] is not None or block_hash in self.cached:
                continue  # already cached, or a duplicate of a cached block (left unhashed: evicted first)
            self.block_hash[block] = block_hash
            self.block_tokens[block] = self._block_key(request, i)
            self.cached[block_hash] = block
