"""n > 1: one client request, n completions that share the prompt's KV blocks.

The parent computes the prompt; at the step that completes it, each child is forked (its table
shares the parent's blocks, ref counts > 1) and samples its first token from the parent's last
logits with its own seed. A group ends when every completion has; children never forked (the
prompt never completed) end with their parent.
"""

from __future__ import annotations

from pagedserve.services.scheduler.request import Request, Status
from pagedserve.shared.protocol.blocks import BlockOp, BlockResult, Fork, Forked

_SEED_MASK = (1 << 63) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # spreads child seeds apart: seed, seed+1 must not give close streams


def child_seed(seed: int | None, index: int) -> int | None:
    return None if seed is None else (seed + index * _GOLDEN) & _SEED_MASK


def plan_forks(parent: Request, owner: str, ops: list[BlockOp]) -> list[tuple[int, Request]]:
    """Fork ops for the children still to come; returns (op index, child) for each."""
    forks: list[tuple[int, Request]] = []
    for i in range(1, parent.fork_children + 1):
        child = Request(
            f"{parent.request_id}#{i}",
            parent.prompt_token_ids,
            parent.sampling,
            parent.arrival,
            parent.worker_id,
            parent_id=parent.request_id,
            index=i,
            seed=child_seed(parent.seed, i),
            tenant=parent.tenant,
            lora=parent.lora,
            detokenize=parent.detokenize,
            deadline=parent.deadline,
        )
        forks.append((len(ops), child))
        ops.append(Fork(parent.request_id, child.request_id, owner))
    return forks


def forked(result: BlockResult) -> bool:
    """Did the block manager fork the child's table? (A refused fork is simply no child this step.)"""
    return type(result) is Forked


def adopt_child(parent: Request, child: Request) -> None:
    """The fork succeeded: the child holds the parent's table and samples in this step."""
    child.status = Status.RUNNING
    child.on_worker = True
    child.num_slots_used = parent.num_slots_used
    child.num_slots_given = parent.num_slots_given
    child.num_known_sent = parent.num_known_sent
    child.pending = 1
    child.in_flight = 1
    child.rope_long = parent.rope_long
    child.shares_last_block = parent.shares_last_block = True


def all_completions(group_id: str, group: list[Request]) -> list[Request]:
    """Every completion of a finished group, by index; children never forked end as their parent did."""
    parent = group[0]
    completions = sorted(group, key=lambda r: r.index)
    for i in range(len(group), parent.sampling.n):
        completions.append(
            Request(
                f"{group_id}#{i}",
                parent.prompt_token_ids,
                parent.sampling,
                parent.arrival,
                parent.worker_id,
                parent_id=group_id,
                index=i,
                status=Status.FINISHED,
                finish_reason=parent.finish_reason,
            )
        )
    return completions
