"""Paged KV memory: a fixed pool of blocks, per-sequence block tables, and a prefix cache.

The block manager only does bookkeeping (no torch): block ids index the per-layer KV
pools that the model runner owns.

Prefix cache. A full block is identified by a chain hash: the first block's hash covers
the model fingerprint, the numerics lane and the request's cache namespace (a keyed
digest from the gateway), each later block's hash covers its predecessor's. A lookup
also compares the block's token ids (collision guard), so KV is reused only for the
same tokens at the same positions, in the same namespace, under the same model.
Requests with cache scope none neither read nor register blocks.

Public prefix segments. When the policy gives a request public segments and its prompt starts
with exactly one's tokens (public_prefix), the blocks wholly inside the segment chain from the
segment's root instead: everyone given that segment shares them. The first block after them
chains from a link of the request's own root and the last public hash (private_link), so no
block past the segment can match across namespaces, even behind the same public blocks.

Ownership, quotas and shares. Every block in use or cached is charged to the tenant
that computed it; a tenant at its quota gains no more. Each active tenant has a guaranteed
share, and which cached block a tenant may take (free first, then the tenant furthest over
its share, then its own; never a block a running sequence holds) is the rule written out
once, in docs/engine.md ("KV admission": Share, Burst, Eviction). _plan and _evict_from implement it;
the scheduler's last resort (allocate with last_resort) is the one exception.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

from engine.envelope import ExecutionEnvelope, PublicSegment, segment_digest
from engine.sequence import Sequence

PREFIX_HASH_VERSION = b"tenantgate-prefix/1"


class AllocatorError(RuntimeError):
    """The block pool's bookkeeping is inconsistent (a leak or a double free)."""


@dataclass(frozen=True)
class KVStats:
    num_blocks: int
    num_free_blocks: int  # neither held nor cached
    num_cached_blocks: int  # held by nobody, kept for prefix reuse (evictable)
    allocated_slots: int
    used_slots: int

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks - self.num_cached_blocks

    @property
    def waste(self) -> float:
        """Share of allocated KV slots that hold no token (the tail of each last block)."""
        return 1 - self.used_slots / self.allocated_slots if self.allocated_slots else 0.0


@dataclass(frozen=True)
class TenantKV:
    """One tenant's part of the pool: blocks its running sequences hold, its cached blocks, its share."""

    held: int
    cached: int
    share: int


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids", "owner")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: bytes | None = None
        self.token_ids: array | None = None
        self.owner: bytes | None = None


def root_hash(fingerprint: str, deterministic: bool, namespace: bytes) -> bytes:
    lane = b"deterministic" if deterministic else b"normal"
    return hashlib.blake2b(
        b"\0".join((PREFIX_HASH_VERSION, fingerprint.encode(), lane, namespace)), digest_size=16
    ).digest()


def chain_hash(prev: bytes, token_ids: array) -> bytes:
    return hashlib.blake2b(prev + token_ids.tobytes(), digest_size=16).digest()


def private_link(own_root: bytes, last_public: bytes) -> bytes:
    """What the first block after a public segment chains from: the request's own root and the
    public chain so far, so its hash needs both the same segment and the same namespace."""
    return hashlib.blake2b(b"private\0" + own_root + last_public, digest_size=16).digest()


def public_prefix(envelope: ExecutionEnvelope, token_ids: list[int],
                  block_size: int) -> tuple[PublicSegment | None, int]:
    """The public segment the prompt starts with exactly (the longest, if several do), and how many
    of its blocks lie wholly inside it; (None, 0) when none matches or none covers a whole block.
    One digest of the prompt's prefix per segment the policy gave (at most MAX_PUBLIC_SEGMENTS)."""
    for segment in sorted(envelope.public_segments, key=lambda s: s.num_tokens, reverse=True):
        blocks = segment.num_tokens // block_size
        if blocks and segment.num_tokens <= len(token_ids) and (
                segment_digest(token_ids[: segment.num_tokens]) == segment.digest):
            return segment, blocks
    return None, 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, fingerprint: str = "") -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.fingerprint = fingerprint
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.cached: dict[bytes, int] = {}  # chain hash -> block id
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 but cached, oldest first
        self._evictable_by_owner: dict[bytes, OrderedDict[int, None]] = {}
        self.charged: Counter[bytes] = Counter()
        self.quotas: dict[bytes, int] = {}
        self.evicted: Counter[bytes] = Counter()  # cached blocks evicted per owner, since take_evictions()
        # Sequences that hold blocks, by request id, to report usage and check invariants.
        self._holders: dict[str, Sequence] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.evictable)

    @property
    def num_held_blocks(self) -> int:
        """Blocks held by requests (neither free nor cached). Safe to read from another thread while
        the engine steps: lengths only, each read atomic (so never below 0 between two of them)."""
        return max(0, self.num_blocks - self.num_free_blocks - self.num_cached_blocks)

    # -- prefix cache ---------------------------------------------------------------

    def _root(self, seq: Sequence) -> bytes | None:
        """What block 0 chains from: its public segment's root, else its own namespace's; None: scope none."""
        ns = seq.envelope.cache_namespace
        if ns is None:
            return None
        if seq.public_segment is not None:
            ns = seq.public_segment.namespace
        return root_hash(self.fingerprint, seq.envelope.deterministic, ns)

    def _link(self, seq: Sequence, i: int, prev: bytes) -> bytes:
        """What block i chains from, given the hash before it: past a public segment, the private link."""
        if i == seq.num_public_blocks and seq.public_segment is not None:
            ns = cast(bytes, seq.envelope.cache_namespace)
            return private_link(root_hash(self.fingerprint, seq.envelope.deterministic, ns), prev)
        return prev

    def match_prefix(self, seq: Sequence) -> tuple[list[int], list[bytes]]:
        """Cached blocks holding seq's leading full blocks: (block ids, their chain hashes).

        At least one token is always left to compute, because the step that computes a
        sequence's last token is the one that samples its next.
        """
        prev = self._root(seq)
        if prev is None or seq.block_table:
            return [], []
        bs = self.block_size
        ids: list[int] = []
        hashes: list[bytes] = []
        for i in range((seq.num_tokens - 1) // bs):
            tokens = array("q", seq.token_ids[i * bs : (i + 1) * bs])
            prev = chain_hash(self._link(seq, i, prev), tokens)
            block_id = self.cached.get(prev)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            ids.append(block_id)
            hashes.append(prev)
        return ids, hashes

    def register_full_blocks(self, seq: Sequence) -> None:
        """Publish seq's newly completed blocks to the prefix cache (scope none: never)."""
        prev = self._root(seq)
        if prev is None:
            return
        bs = self.block_size
        if seq.block_hashes:
            prev = seq.block_hashes[-1]
        for i in range(len(seq.block_hashes), min(seq.num_computed_tokens // bs, len(seq.block_table))):
            tokens = array("q", seq.token_ids[i * bs : (i + 1) * bs])
            prev = chain_hash(self._link(seq, i, prev), tokens)
            seq.block_hashes.append(prev)
            block = self.blocks[seq.block_table[i]]
            if prev not in self.cached and block.hash is None:
                block.hash, block.token_ids = prev, tokens
                self.cached[prev] = block.block_id
            # else another sequence registered the same content first: ours stays private

    # -- allocation -------------------------------------------------------------------

    def set_quota(self, tenant: bytes, quota: int) -> None:
        self.quotas[tenant] = quota

    def quota(self, tenant: bytes) -> int:
        return min(self.quotas.get(tenant, self.num_blocks), self.num_blocks)

    def below_quota(self, tenant: bytes) -> bool:
        return self.charged[tenant] < self.quota(tenant)

    def shares(self, requester: bytes | None = None) -> dict[bytes, int]:
        """Each active tenant's guaranteed share: its quota, scaled down if the quotas oversubscribe the pool.

        Active: charged with a block, or the requester (a tenant asking for its first block).
        Rounded down, so the shares fit in the pool together.
        """
        active = {tenant for tenant, n in self.charged.items() if n > 0}
        if requester is not None:
            active.add(requester)
        quotas = {tenant: self.quota(tenant) for tenant in active}
        total = sum(quotas.values())
        if total <= self.num_blocks:
            return quotas
        return {tenant: q * self.num_blocks // total for tenant, q in quotas.items()}

    def excess(self, tenant: bytes, shares: Mapping[bytes, int]) -> int:
        """Blocks tenant is charged with beyond its share (negative: room left in it)."""
        return self.charged[tenant] - shares.get(tenant, 0)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks seq must gain so that its table covers num_tokens slots."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def allocate(
        self, seq: Sequence, num_tokens: int, prefix: list[int] | tuple[int, ...] = (), last_resort: bool = False,
        keep_own_cache: bool = False,
    ) -> bool:
        """Grow seq's table to cover num_tokens slots, first with the cached prefix blocks; all or
        nothing. keep_own_cache: none of the tenant's own cached blocks are taken for it."""
        needed = self.blocks_needed(seq, num_tokens) - len(prefix)
        sources = self._plan(seq.tenant, needed, prefix, last_resort, keep_own_cache)
        if len(sources) < needed:
            return False
        for block_id in prefix:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self._remove_evictable(block)
            block.ref_count += 1
            seq.block_table.append(block_id)
        for owner in sources:
            block = self._take_block(seq.tenant, owner)
            block.ref_count = 1
            seq.block_table.append(block.block_id)
        if seq.block_table:
            self._holders[seq.seq_id] = seq
        return True

    def fork(self, parent: Sequence, child: Sequence, num_blocks: int) -> None:
        """Give child parent's first num_blocks blocks (full ones, never written again): the
        choices of one request share the prompt's KV, charged once, to the tenant that has it."""
        if child.block_table or num_blocks > len(parent.block_table):
            raise AllocatorError(f"cannot fork {num_blocks} blocks of {parent.seq_id!r} into {child.seq_id!r}")
        for block_id in parent.block_table[:num_blocks]:
            self.blocks[block_id].ref_count += 1
            child.block_table.append(block_id)
        child.block_hashes = parent.block_hashes[:num_blocks]
        if child.block_table:
            self._holders[child.seq_id] = child

    def _plan(
        self, tenant: bytes, needed: int, exclude: Iterable[int], last_resort: bool, keep_own_cache: bool = False,
    ) -> list[bytes | None]:
        """Where tenant's next blocks come from, up to needed of them: None for the free list,
        else the owner whose least recently used cached block is taken. Running blocks and
        the excluded (prefix) blocks are never taken. Fewer than needed: no more can be had."""
        if needed <= 0:
            return []
        quota = self.quota(tenant)
        if needed <= min(self.num_free_blocks, quota - self.charged[tenant]):
            return [None] * needed  # the common case: free blocks within the quota
        shares = self.shares(tenant)
        charged = Counter(self.charged)
        evictable = {owner: len(ids) for owner, ids in self._evictable_by_owner.items()}
        for block_id in exclude:
            if self.blocks[block_id].ref_count == 0:
                evictable[self.blocks[block_id].owner] -= 1  # type: ignore[index]  # a cached block has an owner
        num_free = self.num_free_blocks
        sources: list[bytes | None] = []
        while len(sources) < needed:
            if charged[tenant] < quota and num_free:
                num_free -= 1
                owner = None
            else:
                owner = self._evict_from(tenant, quota, shares, charged, evictable, last_resort, keep_own_cache)
                if owner is None:
                    break
                evictable[owner] -= 1
                charged[owner] -= 1
            charged[tenant] += 1
            sources.append(owner)
        return sources

    def _evict_from(
        self,
        tenant: bytes,
        quota: int,
        shares: Mapping[bytes, int],
        charged: Counter,
        evictable: Mapping[bytes, int],
        last_resort: bool,
        keep_own_cache: bool = False,
    ) -> bytes | None:
        """Whose cached block tenant may take when no free block is open to it (None: nobody's)."""
        own = tenant if evictable.get(tenant) and not keep_own_cache else None
        if charged[tenant] >= quota:
            return own
        floor = max(0, charged[tenant] - shares.get(tenant, 0) + 1)  # the taker's excess once it has the block
        excess = {t: charged[t] - shares.get(t, 0) for t, n in evictable.items() if n and t != tenant}
        victims = [t for t, e in excess.items() if e > floor]
        if victims:
            return max(victims, key=excess.__getitem__)
        if own is None and last_resort:
            return max(excess, key=excess.__getitem__, default=None)
        return own

    def _take_block(self, tenant: bytes, owner: bytes | None) -> Block:
        if owner is None:
            block = self.blocks[self.free_block_ids.popleft()]
        else:
            block = self.blocks[next(iter(self._evictable_by_owner[owner]))]
            self._evict(block)
        block.owner = tenant
        self.charged[tenant] += 1
        return block

    def free(self, seq: Sequence) -> None:
        # Release in reverse: a sequence's tail (least likely to be shared) becomes the
        # least recently used of its cached blocks, so it is evicted first.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise AllocatorError(f"block {block_id} freed twice")
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is not None:
                    self.evictable[block_id] = None
                    owner = cast(bytes, block.owner)  # a cached block has an owner
                    self._evictable_by_owner.setdefault(owner, OrderedDict())[block_id] = None
                else:
                    self._release(block)
        seq.block_table.clear()
        seq.block_hashes.clear()
        seq.num_borrowed_blocks = 0
        self._holders.pop(seq.seq_id, None)

    def free_tail(self, seq: Sequence, num_tokens: int) -> None:
        """Give back seq's blocks past those that cover num_tokens slots (a rejected draft's). They
        were allocated for this sequence alone and never filled up to registration: no other
        holder, no hash."""
        keep = -(-num_tokens // self.block_size)
        while len(seq.block_table) > keep:
            block = self.blocks[seq.block_table[-1]]
            if block.ref_count != 1 or block.hash is not None:
                raise AllocatorError(f"block {block.block_id} of {seq.seq_id!r} is shared or cached; not a draft's")
            seq.block_table.pop()
            block.ref_count = 0
            self._release(block)
        if not seq.block_table:
            self._holders.pop(seq.seq_id, None)

    def _remove_evictable(self, block: Block) -> None:
        del self.evictable[block.block_id]
        own = self._evictable_by_owner[block.owner]  # type: ignore[index]  # an evictable block has an owner
        del own[block.block_id]
        if not own:
            del self._evictable_by_owner[block.owner]  # type: ignore[arg-type]  # an evictable block has an owner

    def _evict(self, block: Block) -> None:
        self.evicted[block.owner] += 1  # type: ignore[index]  # an evictable block has an owner
        self._remove_evictable(block)
        del self.cached[block.hash]  # type: ignore[arg-type]  # an evictable block is cached
        block.hash = None
        block.token_ids = None
        self._uncharge(block.owner)  # type: ignore[arg-type]  # an evictable block has an owner
        block.owner = None

    def _release(self, block: Block) -> None:
        self._uncharge(block.owner)  # type: ignore[arg-type]  # a block in use has an owner
        block.owner = None
        self.free_block_ids.append(block.block_id)

    def _uncharge(self, tenant: bytes) -> None:
        self.charged[tenant] -= 1
        if not self.charged[tenant]:  # tenants come and go: keep only those charged
            del self.charged[tenant]

    # -- reporting ----------------------------------------------------------------------

    def stats(self) -> KVStats:
        allocated = used = 0
        for seq in self._holders.values():
            allocated += len(seq.block_table) * self.block_size
            used += min(seq.num_computed_tokens, len(seq.block_table) * self.block_size)
        return KVStats(self.num_blocks, self.num_free_blocks, self.num_cached_blocks, allocated, used)

    def take_evictions(self) -> Counter[bytes]:
        """The cached blocks evicted per owner since the last call (each step record carries them)."""
        evicted, self.evicted = self.evicted, Counter()
        return evicted

    def tenant_usage(self) -> dict[bytes, TenantKV]:
        """Every tenant charged with a block: what it holds, what it keeps cached, its share."""
        shares = self.shares()
        usage = {}
        for tenant, share in shares.items():
            cached = len(self._evictable_by_owner.get(tenant, ()))
            usage[tenant] = TenantKV(self.charged[tenant] - cached, cached, share)
        return usage

    def check_invariants(self, live: Iterable[Sequence] = ()) -> None:
        """Raise AllocatorError unless every block is in exactly one consistent state."""
        free = list(self.free_block_ids)
        if len(set(free)) != len(free):
            raise AllocatorError("a block appears twice on the free list")
        free_set = set(free)
        held: Counter[int] = Counter()
        for seq in self._holders.values():
            if not seq.block_table:
                raise AllocatorError(f"{seq.seq_id!r} is registered but holds no block")
            held.update(seq.block_table)
        owners: Counter[bytes] = Counter()
        for block in self.blocks:
            bid = block.block_id
            if held[bid] != block.ref_count:
                raise AllocatorError(f"block {bid}: ref count {block.ref_count} but {held[bid]} holders")
            states = (bid in free_set) + (bid in self.evictable) + (block.ref_count > 0)
            if states != 1:
                raise AllocatorError(f"block {bid} is in {states} of the states free/cached/held")
            if (block.owner is None) != (bid in free_set):
                raise AllocatorError(f"block {bid}: an owner exactly when not free is violated")
            if bid in self.evictable and block.hash is None:
                raise AllocatorError(f"block {bid} is evictable but not cached")
            if block.hash is not None and self.cached.get(block.hash) != bid:
                raise AllocatorError(f"block {bid}: the cache index disagrees with its hash")
            if block.owner is not None:
                owners[block.owner] += 1
            owned: Mapping[int, None] = self._evictable_by_owner.get(block.owner, {}) if block.owner is not None else {}
            if bid in self.evictable and bid not in owned:
                raise AllocatorError(f"block {bid} is missing from its owner's LRU list")
        if +owners != +self.charged:
            raise AllocatorError("per-tenant charges disagree with block ownership")
        if len(self.cached) != sum(1 for b in self.blocks if b.hash is not None):
            raise AllocatorError("the cache index holds blocks that are not cached")
        live_ids = {seq.seq_id for seq in live}
        leaked = set(self._holders) - live_ids
        if leaked:
            raise AllocatorError(f"{len(leaked)} finished or unknown sequences still hold blocks")
