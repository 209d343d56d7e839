"""The router's decisions, with no sockets: a client frame or a shard's reply in, the frames to send out.

Clients speak the scheduler's own protocol to the router (shared/protocol/frontend.py), and the router
relays each frame unchanged, behind one hop of routing: a shard sees every client as (router, client),
so its per-client book (liveness, in-flight limits, replays) works as if the client were direct.

- A new Submit is placed by the policy (placement.py) and remembered with its shard.
- A frame for a request the router knows goes to its shard. One it does not know (an attach after the
  router restarted, an Abort) waits while every live shard is asked `Locate`.
- Pings are answered here and passed on to the shards that hold the client's requests, which keep
  judging the client's liveness themselves.
- A shard that falls silent (or whose scheduler restarted) is down: its requests are placed again on
  the live shards, from the kept submit; whatever the old shard still sends for them is dropped and
  aborted there. A request never moves between live shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedserve.services.router.placement import Placement
from pagedserve.services.router.prefix_index import CHARS_PER_TOKEN, prompt_blocks
from pagedserve.services.router.requests import Locating, Placed, RouterBook
from pagedserve.shared.protocol.frontend import Abort, Error, Locate, Location, Ping, Pong
from pagedserve.shared.protocol.messages import encode_message
from pagedserve.shared.transport import Route

SELF: Route = (b"pagedserve-router",)  # the router's own hop: its pings and Locates to the shards
PING = encode_message(Ping())
PONG = encode_message(Pong())
_ENDS = ("finished", "error")
_BY_REQUEST = ("submit", "abort", "stop_at", "locate")  # client messages that go to the request's shard


@dataclass(frozen=True, slots=True)
class Send:
    """A frame out: to a client (`shard` None; `route` is the client) or to a shard, behind `route`."""

    shard: int | None
    route: Route
    frame: bytes


def to_client(client: Route, message: Any) -> Send:
    return Send(None, client, encode_message(message))


class RouterCore:
    def __init__(
        self,
        placement: Placement,
        block_size: int,
        ping_interval_s: float,
        shard_timeout_s: float,
        locate_timeout_s: float,
    ) -> None:
        self.placement = placement
        self.block_size = block_size
        self.ping_interval_s = ping_interval_s
        self.shard_timeout_s = shard_timeout_s
        self.locate_timeout_s = locate_timeout_s
        self.book = RouterBook()
        self.last_heard = [float("-inf")] * placement.num_shards
        self.next_ping = 0.0
        self.stranded: list[str] = []  # placed on a lost shard while no shard was alive
        # Client frames that came while no shard was alive (a router just started, all shards
        # restarting): taken up when one answers, refused at their deadline.
        self.held: list[tuple[Route, dict[str, Any], bytes, float]] = []
        self.counts: dict[str, int] = {}  # what happened, by name: the router's metrics read it

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # ------------------------------------------------------------------ clients -> shards

    def on_client(self, client: Route, msg: dict[str, Any], frame: bytes, now: float) -> list[Send]:
        kind = msg.get("type")
        rid = msg.get("request_id")
        if kind == "ping":
            return [to_client(client, Pong()), *(Send(s, client, frame) for s in self.book.shards_of(client))]
        alive = self.placement.alive()
        if not alive:
            self.held.append((client, msg, frame, now + self.shard_timeout_s))
            return []
        if not isinstance(rid, str) or kind not in _BY_REQUEST:
            # Not ours to judge: any live shard answers it with the Error a direct client would get.
            return [Send(alive[0], client, frame)]
        placed = self.book.placed.get(rid)
        if placed is not None:
            if kind == "submit" and msg.get("attach"):
                self.book.reroute(rid, client)
            return [Send(placed.shard, client, frame)]
        if kind == "submit" and not msg.get("attach"):
            return self._place(rid, client, frame, *self._shape(msg))
        return self._locate(rid, client, frame, kind, msg, now)

    def _place(self, rid: str, client: Route, frame: bytes, blocks: list[int], cost: int) -> list[Send]:
        chosen = self.placement.choose(blocks)
        if chosen is None:
            return [_unavailable(client, rid)]
        shard, reason = chosen
        self._count(f"placed_{reason}")
        self.placement.started(shard, blocks, cost)
        self.book.place(rid, Placed(client, shard, frame, blocks, cost))
        return [Send(shard, client, frame)]

    def _shape(self, msg: dict[str, Any]) -> tuple[list[int], int]:
        """The prompt's block hashes and the request's load estimate (prompt + what it may generate)."""
        prompt = msg.get("prompt_token_ids") or msg.get("prompt") or ""
        if not isinstance(prompt, (str, list)):
            prompt = ""
        sampling = msg.get("sampling")
        sampling = sampling if isinstance(sampling, dict) else {}
        generated = _int(sampling.get("max_tokens"), 16) * _int(sampling.get("n"), 1)
        prompt_tokens = len(prompt) // CHARS_PER_TOKEN if isinstance(prompt, str) else len(prompt)
        return prompt_blocks(prompt, self.block_size), prompt_tokens + generated

    def _locate(
        self, rid: str, client: Route, frame: bytes, kind: str, msg: dict[str, Any], now: float
    ) -> list[Send]:
        if rid in self.book.locating:
            return []  # asked already (a second re-submit): the first answer serves it
        alive = self.placement.alive()
        self._count("locates")
        blocks, cost = self._shape(msg) if kind == "submit" else ([], 0)
        self.book.locating[rid] = Locating(
            client, frame, kind, set(alive), now + self.locate_timeout_s, blocks, cost
        )
        ask = encode_message(Locate(request_id=rid))
        return [Send(s, SELF, ask) for s in alive]

    def _located(self, rid: str, shard: int | None) -> list[Send]:
        """The locate of `rid` is over: `shard` holds it, or none does."""
        loc = self.book.locating.pop(rid)
        if shard is not None:
            if loc.kind == "submit":
                self.placement.started(shard, loc.blocks, loc.cost)
                self.book.place(rid, Placed(loc.client, shard, loc.frame, loc.blocks, loc.cost))
            return [Send(shard, loc.client, loc.frame)]
        if loc.kind == "submit":
            return self._place(rid, loc.client, loc.frame, loc.blocks, loc.cost)
        if loc.kind == "locate":
            return [to_client(loc.client, Location(request_id=rid, state="unknown"))]
        if loc.kind == "stop_at":
            return []  # the request ended meanwhile: nothing to stop
        message = f"request_id: {rid!r} is not live"
        return [to_client(loc.client, Error(code="unknown_request", message=message, request_id=rid))]

    # ------------------------------------------------------------------ shards -> clients

    def on_shard(self, shard: int, route: Route, msg: dict[str, Any], frame: bytes, now: float) -> list[Send]:
        self.last_heard[shard] = now
        out = [] if self.placement.shards[shard].alive else self._shard_up(shard, now)
        kind = msg.get("type")
        rid = msg.get("request_id")
        if not isinstance(rid, str):
            # Pongs (the router answers pings itself) and request-less errors (a bad frame).
            if kind != "pong" and route != SELF:
                out.append(Send(None, route, frame))
            return out
        if route == SELF:
            if kind == "location" and rid in self.book.locating:
                out += self._on_location(rid, shard, msg.get("state"))
            return out
        placed = self.book.placed.get(rid)
        if placed is not None and placed.shard != shard:
            # The request moved while this shard was thought lost: its copy here must stop.
            self._count("stale_replies")
            if kind not in _ENDS:
                out.append(Send(shard, route, encode_message(Abort(request_id=rid))))
            return out
        if placed is not None and kind in _ENDS:
            self.book.end(rid)
            self.placement.ended(shard, placed.cost)
        out.append(Send(None, placed.client if placed is not None else route, frame))
        return out

    def _on_location(self, rid: str, shard: int, state: object) -> list[Send]:
        loc = self.book.locating[rid]
        loc.waiting.discard(shard)
        if state in ("live", "finished"):
            return self._located(rid, shard)
        return self._located(rid, None) if not loc.waiting else []

    # ------------------------------------------------------------------ shard liveness

    def tick(self, now: float) -> list[Send]:
        out: list[Send] = []
        if now >= self.next_ping:
            self.next_ping = now + self.ping_interval_s
            out += [Send(s, SELF, PING) for s in range(self.placement.num_shards)]
        for shard in self.placement.alive():
            if now - self.last_heard[shard] > self.shard_timeout_s:
                out += self.shard_lost(shard, "silent")
        for rid in self.book.lapsed_locates(now):
            out += self._located(rid, None)  # a shard that does not answer in time does not hold it
        lapsed = [h for h in self.held if now >= h[3]]
        if lapsed:
            self.held = [h for h in self.held if now < h[3]]
            out += [_unavailable(client, msg.get("request_id")) for client, msg, _, _ in lapsed]
        return out

    def _shard_up(self, shard: int, now: float) -> list[Send]:
        self._count("shards_up")
        self.placement.set_alive(shard, True)
        stranded, self.stranded = self.stranded, []
        held, self.held = self.held, []
        out = [send for rid in stranded for send in self._replace(rid)]
        return out + [
            send for client, msg, frame, _ in held for send in self.on_client(client, msg, frame, now)
        ]

    def shard_lost(self, shard: int, why: str) -> list[Send]:
        """The shard's scheduler is gone (silent, or its connection dropped: a restart forgot every
        request): its requests start over on the live shards."""
        if not self.placement.shards[shard].alive:
            return []
        self._count(f"shards_lost_{why}")
        self.placement.set_alive(shard, False)
        out: list[Send] = []
        for rid in self.book.on_shard(shard):
            placed = self.book.placed[rid]
            self.placement.ended(shard, placed.cost)
            out += self._replace(rid)
        for rid, loc in list(self.book.locating.items()):
            loc.waiting.discard(shard)
            if not loc.waiting:
                out += self._located(rid, None)
        return out

    def _replace(self, rid: str) -> list[Send]:
        placed = self.book.placed.get(rid)
        if placed is None:
            return []
        chosen = self.placement.choose(placed.blocks)
        if chosen is None:
            self.stranded.append(rid)  # placed again as soon as a shard is up
            return []
        self._count("replaced")
        placed.shard = chosen[0]
        self.placement.started(placed.shard, placed.blocks, placed.cost)
        return [Send(placed.shard, placed.client, placed.frame)]


def _unavailable(client: Route, rid: object) -> Send:
    return to_client(
        client,
        Error(
            code="no_workers",
            message="no scheduler shard answered in time; retry later",
            request_id=rid if isinstance(rid, str) else None,
        ),
    )


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default
