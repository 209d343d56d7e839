"""The router's decisions frame by frame, without sockets: relaying both ways, pings, finding a request's
shard after a restart, and moving the requests of a lost shard (its late replies dropped and aborted)."""

from __future__ import annotations

from typing import Any

from pagedserve.services.router.core import PING, SELF, RouterCore, Send
from pagedserve.services.router.placement import Placement
from pagedserve.shared.protocol.codec import decode
from pagedserve.shared.protocol.frontend import Abort, Delta, Finished, Location, Ping, Pong, Submit, Usage
from pagedserve.shared.protocol.messages import encode_message

CLIENT = (b"\x00client",)


def router(shards: int = 2) -> RouterCore:
    core = RouterCore(Placement(shards), 16, ping_interval_s=0.5, shard_timeout_s=3.0, locate_timeout_s=2.0)
    for shard in range(shards):
        core.on_shard(shard, SELF, {"type": "pong"}, encode_message(Pong()), 0.0)
    return core


def frame(message: Any) -> tuple[dict[str, Any], bytes]:
    data = encode_message(message)
    return decode(data), data


def submit(core: RouterCore, rid: str, now: float = 1.0, attach: bool = False, client=CLIENT) -> list[Send]:
    msg, data = frame(Submit(request_id=rid, prompt_token_ids=[1, 2, 3], attach=attach))
    return core.on_client(client, msg, data, now)


def reply(core: RouterCore, shard: int, message: Any, route=CLIENT, now: float = 1.0) -> list[Send]:
    msg, data = frame(message)
    return core.on_shard(shard, route, msg, data, now)


def kinds(sends: list[Send]) -> list[tuple[int | None, str]]:
    return [(s.shard, decode(s.frame)["type"]) for s in sends]


def finished(rid: str) -> Finished:
    return Finished(request_id=rid, outputs=[], usage=Usage(prompt_tokens=3, completion_tokens=0))


def test_a_submit_goes_to_one_shard_and_its_replies_come_back_to_the_client():
    core = router()
    (out,) = submit(core, "r1")
    assert out.route == CLIENT and out.shard in (0, 1)
    shard = out.shard
    assert shard is not None
    delta = reply(core, shard, Delta(request_id="r1", token_ids=[5], text="x"))
    assert delta == [Send(None, CLIENT, encode_message(Delta(request_id="r1", token_ids=[5], text="x")))]
    assert core.placement.shards[shard].requests == 1
    assert kinds(reply(core, shard, finished("r1"))) == [(None, "finished")]
    assert core.placement.shards[shard].requests == 0 and core.placement.shards[shard].tokens == 0
    assert "r1" not in core.book.placed


def test_pings_are_answered_here_and_passed_to_the_shards_holding_the_clients_requests():
    core = router()
    msg, data = frame(Ping())
    assert kinds(core.on_client(CLIENT, msg, data, 1.0)) == [(None, "pong")]
    (placed,) = submit(core, "r1")
    assert kinds(core.on_client(CLIENT, msg, data, 1.0)) == [(None, "pong"), (placed.shard, "ping")]
    assert reply(core, 0, Pong()) == []  # the shard's answer to the client's ping stays here


def test_an_attach_for_an_unknown_request_asks_every_shard_and_goes_to_the_one_that_holds_it():
    core = router()
    asks = submit(core, "r9", attach=True)
    assert [(s.shard, s.route) for s in asks] == [(0, SELF), (1, SELF)]
    assert reply(core, 0, Location(request_id="r9", state="unknown"), route=SELF) == []
    out = reply(core, 1, Location(request_id="r9", state="live"), route=SELF)
    assert [(s.shard, s.route) for s in out] == [(1, CLIENT)]
    assert core.book.placed["r9"].shard == 1
    assert reply(core, 0, Location(request_id="r9", state="live"), route=SELF) == []  # late: ignored


def test_an_attach_nobody_holds_is_placed_as_new_and_an_abort_nobody_holds_is_refused():
    core = router()
    submit(core, "r9", attach=True)
    reply(core, 0, Location(request_id="r9", state="unknown"), route=SELF)
    (placed,) = reply(core, 1, Location(request_id="r9", state="unknown"), route=SELF)
    assert placed.route == CLIENT and "r9" in core.book.placed
    msg, data = frame(Abort(request_id="gone"))
    assert kinds(core.on_client(CLIENT, msg, data, 1.0)) == [(0, "locate"), (1, "locate")]
    assert "gone" in core.book.locating
    refused = [s for s in core.tick(3.0) if s.shard is None]  # nobody answered in time
    assert [decode(s.frame)["code"] for s in refused] == ["unknown_request"]
    assert "gone" not in core.book.locating and core.placement.alive() == [0, 1]


def test_a_lost_shards_requests_start_over_on_the_other_and_its_late_replies_are_stopped():
    core = router()
    (first,) = submit(core, "r1")
    lost = first.shard
    assert lost is not None
    moved = core.shard_lost(lost, "disconnected")
    assert [(s.shard, s.route, s.frame) for s in moved] == [(1 - lost, CLIENT, first.frame)]
    assert core.book.placed["r1"].shard == 1 - lost
    late = reply(core, lost, Delta(request_id="r1", token_ids=[5], text="x"))
    assert kinds(late) == [(lost, "abort")]  # the old copy is told to stop; the client sees nothing
    assert reply(core, lost, finished("r1")) == []
    assert kinds(reply(core, 1 - lost, finished("r1"))) == [(None, "finished")]


def test_with_no_shard_alive_frames_wait_for_one_until_their_deadline():
    core = router(shards=1)
    (first,) = submit(core, "r1")
    assert core.shard_lost(0, "disconnected") == []
    assert submit(core, "r2", now=1.5) == []  # held: a shard may be restarting
    back = reply(core, 0, Pong(), route=SELF, now=2.0)  # the restarted scheduler answers
    assert [(s.shard, s.frame) for s in back][0] == (0, first.frame)  # the stranded one placed again
    assert [decode(s.frame)["request_id"] for s in back] == ["r1", "r2"]

    fresh = RouterCore(Placement(1), 16, ping_interval_s=0.5, shard_timeout_s=3.0, locate_timeout_s=2.0)
    assert submit(fresh, "r3", now=0.0) == []  # a router just started: nobody heard yet
    assert fresh.tick(1.0) == [Send(0, SELF, PING)]
    refused = [s for s in fresh.tick(3.5) if s.shard is None]
    assert [decode(s.frame)["code"] for s in refused] == ["no_workers"]


def test_a_silent_shard_is_lost_after_its_timeout_and_pings_go_out_every_interval():
    core = router()
    sends = core.tick(1.0)
    assert [(s.shard, s.frame) for s in sends] == [(0, PING), (1, PING)]
    assert core.tick(1.2) == []
    reply(core, 0, Pong(), route=SELF, now=3.5)
    core.tick(3.6)
    assert core.placement.alive() == [0]


def test_a_reattached_request_follows_its_new_route_and_the_old_one_lets_go():
    core = router()
    (first,) = submit(core, "r1")
    shard = first.shard
    assert shard is not None
    moved = (b"\x00client-again",)
    (again,) = submit(core, "r1", attach=True, client=moved)
    assert (again.shard, again.route) == (shard, moved)
    assert core.book.shards_of(CLIENT) == set() and core.book.shards_of(moved) == {shard}
    delta = reply(core, shard, Delta(request_id="r1", token_ids=[5], text="x"), route=moved)
    assert [s.route for s in delta] == [moved]
    reply(core, shard, finished("r1"), route=moved)
    assert core.book.by_client == {}
