"""A ghost owner: a bare socket speaking the block-manager protocol, which allocates block tables on
a worker's pool and is never heard from again. Its leases lapse and the reaper takes them back:
the shape of a scheduler killed mid-step, made on purpose."""

from __future__ import annotations

import zmq

from pagedserve.shared.protocol.blocks import Alloc, Allocation, BlockBatch, BlockReply
from pagedserve.shared.protocol.codec import decode
from pagedserve.shared.protocol.messages import message_table, read_message
from pagedserve.shared.transport import make_socket, send


def ghost_allocate(endpoint: str, pool_id: str, prompts: list[list[int]], owner: str) -> list[list[int]]:
    """Allocate every prompt on `pool_id` as `owner` (request ids `<owner>-<i>`), then go silent;
    the block ids of each table."""
    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.DEALER, max_message_bytes=1 << 20)
    try:
        sock.connect(endpoint)
        ops = [Alloc(pool_id, f"{owner}-{i}", owner, p, len(p)) for i, p in enumerate(prompts)]
        send(sock, BlockBatch(1, ops))
        assert sock.poll(10_000), "the block manager did not answer the ghost's batch"
        reply = read_message(decode(sock.recv(), 1 << 20), message_table(BlockReply))
        tables = [r.block_ids for r in reply.results if isinstance(r, Allocation)]
        assert len(tables) == len(prompts), reply.results
        return tables
    finally:
        sock.close(0)
        ctx.term()
