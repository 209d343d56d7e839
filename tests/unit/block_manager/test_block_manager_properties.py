"""Stateful property test: random interleavings of every block-manager op, checked after each one.

Besides the manager's own bookkeeping, the test keeps a shadow of the worker's KV: each slot a
request is given is "written" with what real KV at that position depends on (the request's true
tokens up to and including it), and copy-on-write copies are performed. The strongest check is then that every live request reads back exactly its
own tokens from its block table: a wrong prefix-cache hit, a missing copy-on-write or a block
handed to two requests at once all break it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pagedserve.services.block_manager.manager import BlockManager

TTL = 5.0
POOL_IDS = ("w0", "w1")
OWNERS = ("s1", "s2")
ALPHABET = st.integers(0, 2)  # few distinct tokens: prefixes collide often, so hits are common
BASES = ((0, 1, 0, 1, 0, 1, 0, 1, 0, 1), (2, 2, 2, 2, 2, 2, 2, 2, 2, 2), (0, 1, 0, 1, 2, 2, 0, 0, 1, 1))


@dataclass
class Req:
    pool_id: str
    owner: str
    seq: list[int]  # the request's true tokens: known ones first, then those still to be sampled
    known: int
    slots: int
    expires_at: float
    block_ids: list[int] = field(default_factory=list)


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.manager = BlockManager(lease_ttl_s=TTL)
        self.now = 0.0
        self.block_sizes: dict[str, int] = {}
        # pool -> block -> per slot, the tokens its KV was computed from (the prefix up to that slot)
        self.kv: dict[str, dict[int, list[tuple[int, ...] | None]]] = {}
        self.reqs: dict[str, Req] = {}
        self.next_id = 0

    # ------------------------------------------------------------ helpers

    def _new_id(self) -> str:
        self.next_id += 1
        return f"r{self.next_id}"

    def _extend_truth(self, req: Req, length: int, data: st.DataObject) -> None:
        while len(req.seq) < length:
            req.seq.append(data.draw(ALPHABET))

    def _write(self, req: Req, start: int, end: int) -> None:
        """The worker computes positions start..end-1 into the request's blocks."""
        bs = self.block_sizes[req.pool_id]
        kv = self.kv[req.pool_id]
        for p in range(start, end):
            kv[req.block_ids[p // bs]][p % bs] = tuple(req.seq[: p + 1])

    def _refs(self) -> dict[str, dict[int, int]]:
        refs: dict[str, dict[int, int]] = {pid: {} for pid in self.block_sizes}
        for req in self.reqs.values():
            for b in req.block_ids:
                refs[req.pool_id][b] = refs[req.pool_id].get(b, 0) + 1
        return refs

    def _live(self, data: st.DataObject) -> str | None:
        """A live request; with none live, allocate one (preconditions would make hypothesis give up
        on too many runs, since most rules need a request)."""
        if not self.reqs:
            self.allocate(data)
        return data.draw(st.sampled_from(sorted(self.reqs))) if self.reqs else None

    # ------------------------------------------------------------ pools

    @initialize(num_blocks=st.integers(4, 16), bs=st.sampled_from((2, 4)))
    def first_pool(self, num_blocks: int, bs: int) -> None:
        self.add_pool("w0", num_blocks, bs)

    @rule(pool_id=st.sampled_from(POOL_IDS), num_blocks=st.integers(1, 16), bs=st.sampled_from((1, 2, 4)))
    def add_pool(self, pool_id: str, num_blocks: int, bs: int) -> None:
        self.manager.add_pool(pool_id, num_blocks, bs)
        for rid in [rid for rid, r in self.reqs.items() if r.pool_id == pool_id]:
            del self.reqs[rid]
        self.block_sizes[pool_id] = bs
        self.kv[pool_id] = {b: [None] * bs for b in range(num_blocks)}

    @rule(data=st.data())
    def remove_pool(self, data: st.DataObject) -> None:
        if not self.block_sizes:
            return
        pool_id = data.draw(st.sampled_from(sorted(self.block_sizes)))
        dropped = self.manager.remove_pool(pool_id)
        expected = {rid for rid, r in self.reqs.items() if r.pool_id == pool_id}
        assert set(dropped) == expected
        for rid in expected:
            del self.reqs[rid]
        del self.block_sizes[pool_id], self.kv[pool_id]
        assert not self.manager.has_pool(pool_id)

    # ------------------------------------------------------------ requests

    @rule(data=st.data())
    def allocate(self, data: st.DataObject) -> None:
        if not self.block_sizes:
            return
        pool_id = data.draw(st.sampled_from(sorted(self.block_sizes)))
        bs = self.block_sizes[pool_id]
        base = data.draw(st.sampled_from(BASES))
        prompt = list(base[: data.draw(st.integers(0, len(base)))]) + data.draw(
            st.lists(ALPHABET, max_size=4)
        )
        if not prompt:
            prompt = [0]
        max_new = data.draw(st.integers(0, len(prompt) + 2))
        owner = data.draw(st.sampled_from(OWNERS))
        rid = self._new_id()
        before = self.manager.snapshot(self.now)
        allocation = self.manager.allocate(pool_id, rid, owner, prompt, max_new, self.now)
        if allocation is None:
            event("allocate: refused, too few free blocks")
            assert self.manager.snapshot(self.now) == before
            return
        cached, new = allocation.num_cached_tokens, allocation.num_new_tokens
        if cached:
            event("allocate: prefix-cache hit")
        assert cached % bs == 0 and cached <= len(prompt) - 1
        assert new == min(max_new, len(prompt) - cached)
        assert len(allocation.block_ids) == -(-(cached + new) // bs)
        req = Req(
            pool_id, owner, list(prompt), len(prompt), cached + new, self.now + TTL, allocation.block_ids
        )
        # A hit must hold exactly this prompt's tokens (read back from the shadow KV below).
        self.reqs[rid] = req
        self._write(req, cached, cached + new)

    @rule(data=st.data())
    def grow(self, data: st.DataObject) -> None:
        rid = self._live(data)
        if rid is not None:
            self._grow(rid, data)

    def _grow(self, rid: str, data: st.DataObject, min_slots: int = 0) -> None:
        req = self.reqs[rid]
        bs = self.block_sizes[req.pool_id]
        n = data.draw(st.integers(min_slots, 2 * bs + 1))
        m = data.draw(st.integers(0, 3))  # tokens that became known: ahead of or behind the slots
        self._extend_truth(req, max(req.slots + n, req.known + m), data)
        new_tokens = req.seq[req.known : req.known + m]
        refs_before = self._refs()[req.pool_id]
        writes_shared_tail = n > 0 and req.slots % bs != 0 and refs_before[req.block_ids[-1]] > 1
        before = self.manager.snapshot(self.now)
        growth = self.manager.grow(rid, n, new_tokens, self.now)
        if growth is None:
            event("grow: refused, too few free blocks")
            assert self.manager.snapshot(self.now) == before
            return
        if writes_shared_tail:
            event("grow: copy-on-write")
        assert len(growth.copies) == (1 if writes_shared_tail else 0)
        kv = self.kv[req.pool_id]
        for (index, new_id), (src, dst) in zip(growth.replaced, growth.copies, strict=True):
            assert req.block_ids[index] == src and dst == new_id
            kv[dst] = list(kv[src])
            req.block_ids[index] = dst
        req.block_ids.extend(growth.new_block_ids)
        assert self.manager.table(rid) == req.block_ids
        req.known += len(new_tokens)
        req.expires_at = self.now + TTL
        self._write(req, req.slots, req.slots + n)
        req.slots += n

    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        rid = self._live(data)
        if rid is not None:
            self._fork(rid, data)

    def _fork(self, parent_id: str, data: st.DataObject) -> str:
        parent = self.reqs[parent_id]
        child_id = self._new_id()
        owner = data.draw(st.sampled_from(OWNERS))
        assert self.manager.fork(parent_id, child_id, owner, self.now) is True
        shared = parent.seq[: max(parent.slots, parent.known)]
        self.reqs[child_id] = Req(
            parent.pool_id, owner, shared, parent.known, parent.slots, self.now + TTL, list(parent.block_ids)
        )
        parent.expires_at = self.now + TTL
        return child_id

    @rule(data=st.data())
    def write_into_forked_child(self, data: st.DataObject) -> None:
        """The parallel-sampling pattern: fork, then the child writes its own next token."""
        rid = self._live(data)
        if rid is not None:
            self._grow(self._fork(rid, data), data, min_slots=1)

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = self._live(data)
        if rid is None:
            return
        req = self.reqs.pop(rid)
        refs = self._refs()[req.pool_id]
        expected = sum(1 for b in set(req.block_ids) if refs.get(b, 0) == 0)
        assert self.manager.free(rid) == expected
        assert self.manager.free(rid) == 0

    @rule(owner=st.sampled_from(OWNERS))
    def renew_owner(self, owner: str) -> None:
        mine = [r for r in self.reqs.values() if r.owner == owner]
        assert self.manager.renew_owner(owner, self.now) == len(mine)
        for req in mine:
            req.expires_at = self.now + TTL

    @rule(dt=st.sampled_from((0.5, 1.0, 2.5, 6.0)))
    def advance_clock_and_reap(self, dt: float) -> None:
        self.now += dt
        reclaimed = self.manager.reap_expired(self.now)
        expected = {rid for rid, r in self.reqs.items() if r.expires_at <= self.now}
        assert {r.request_id for r in reclaimed} == expected
        if reclaimed:
            event("reap: reclaimed leases")
        for r in reclaimed:
            req = self.reqs.pop(r.request_id)
            assert (r.owner, r.pool_id) == (req.owner, req.pool_id)

    # ------------------------------------------------------------ checked after every step

    @invariant()
    def bookkeeping_holds(self) -> None:
        assert self.manager.check_invariants() == []
        snap = self.manager.snapshot(self.now)
        assert {lease["request_id"] for lease in snap["leases"]} == set(self.reqs)
        refs = self._refs()
        for pool in snap["pools"]:
            pool_id = pool["worker_id"]
            totals = pool["totals"]
            assert totals["free"] + totals["used"] == totals["total"] == pool["num_blocks"]
            assert totals["leaked"] == 0  # the test reaps on every clock step
            for block in pool["blocks"]:
                assert block["ref_count"] == refs[pool_id].get(block["id"], 0)
            assert self.manager.num_free_blocks(pool_id) == sum(
                1 for b in pool["blocks"] if b["ref_count"] == 0
            )
            if not any(r.pool_id == pool_id for r in self.reqs.values()):
                assert totals["free"] == totals["total"]

    @invariant()
    def every_request_reads_back_its_own_tokens(self) -> None:
        for rid, req in self.reqs.items():
            assert self.manager.table(rid) == req.block_ids
            bs = self.block_sizes[req.pool_id]
            kv = self.kv[req.pool_id]
            assert len(req.block_ids) == -(-req.slots // bs)
            for p in range(req.slots):
                assert kv[req.block_ids[p // bs]][p % bs] == tuple(req.seq[: p + 1]), (rid, p)

    def teardown(self) -> None:
        for rid in list(self.reqs):
            self.manager.free(rid)
        for pool_id, (num_blocks, _) in self.manager.pools().items():
            assert self.manager.num_free_blocks(pool_id) == num_blocks
        assert self.manager.check_invariants() == []


BlockManagerMachine.TestCase.settings = settings(
    max_examples=500,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_block_manager_under_random_op_sequences = BlockManagerMachine.TestCase
