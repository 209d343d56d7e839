"""Which shard takes a new request: the placement policy, with no sockets and no clock.

`cache_aware` follows the routers of SGLang and vLLM: when the shards' loads are far apart (by more
than `balance_abs` outstanding tokens and by more than `balance_rel` times), the least loaded shard
takes the request; otherwise the shard that has seen the longest start of this prompt takes it, if
that start is at least `cache_threshold` of the prompt's hashed blocks; otherwise the least loaded
shard. `round_robin` and `least_load` are the baselines it is measured against.

A request's load is its estimated prompt tokens plus the tokens it may generate (max_tokens x n),
counted from placement until its Finished or Error passes the router.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pagedserve.services.router.prefix_index import SeenPrefixes
from pagedserve.shared.config import config_default
from pagedserve.shared.config_sections import RouterSection

Policy = Literal["cache_aware", "round_robin", "least_load"]
# Why a shard was chosen: the label of the router's placement counter.
Reason = Literal["cache", "balance", "least_load", "round_robin"]


@dataclass(slots=True)
class Shard:
    seen: SeenPrefixes
    alive: bool = False
    requests: int = 0
    tokens: int = 0


@dataclass(slots=True)
class Placement:
    num_shards: int
    policy: Policy = config_default("router_policy")
    cache_threshold: float = config_default("router_cache_threshold")
    balance_abs: int = config_default("router_balance_abs")
    balance_rel: float = config_default("router_balance_rel")
    seen_capacity: int = 65536
    shards: list[Shard] = field(init=False)
    _turn: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.shards = [Shard(SeenPrefixes(self.seen_capacity)) for _ in range(self.num_shards)]

    @classmethod
    def of(cls, router: RouterSection) -> Placement:
        """The placement a router's section asks for, over its shards."""
        return cls(
            len(router.router_shards),
            router.router_policy,
            router.router_cache_threshold,
            router.router_balance_abs,
            router.router_balance_rel,
        )

    def alive(self) -> list[int]:
        return [i for i, s in enumerate(self.shards) if s.alive]

    def choose(self, blocks: Sequence[int]) -> tuple[int, Reason] | None:
        """The shard for a request whose prompt starts with `blocks`; None while no shard is alive."""
        alive = self.alive()
        if not alive:
            return None
        self._turn += 1
        if self.policy == "round_robin":
            return alive[self._turn % len(alive)], "round_robin"
        # Ties (idle shards above all) take turns: cold requests spread instead of piling on shard 0.
        n = self.num_shards
        least = min(
            alive, key=lambda i: (self.shards[i].tokens, self.shards[i].requests, (i - self._turn) % n)
        )
        if self.policy == "least_load":
            return least, "least_load"
        loads = [self.shards[i].tokens for i in alive]
        if max(loads) - min(loads) > self.balance_abs and max(loads) > self.balance_rel * min(loads):
            return least, "balance"
        if blocks:
            # The longest seen start wins; among equals, the lighter shard, then the first.
            matched, _, first = max(
                (self.shards[i].seen.matched(blocks), -self.shards[i].tokens, -i) for i in alive
            )
            best = -first
            if matched and matched / len(blocks) >= self.cache_threshold:
                return best, "cache"
        return least, "least_load"

    def started(self, shard: int, blocks: Sequence[int], cost: int) -> None:
        s = self.shards[shard]
        s.requests += 1
        s.tokens += cost
        s.seen.add(blocks)

    def ended(self, shard: int, cost: int) -> None:
        s = self.shards[shard]
        s.requests = max(0, s.requests - 1)
        s.tokens = max(0, s.tokens - cost)

    def set_alive(self, shard: int, alive: bool) -> None:
        s = self.shards[shard]
        if s.alive and not alive:
            s.seen.clear()  # a restarted scheduler's workers may be new: nothing cached is known
        s.alive = alive

    def view(self) -> list[dict[str, Any]]:
        return [
            {
                "shard": i,
                "alive": s.alive,
                "requests": s.requests,
                "tokens": s.tokens,
                "seen_blocks": len(s.seen),
            }
            for i, s in enumerate(self.shards)
        ]
