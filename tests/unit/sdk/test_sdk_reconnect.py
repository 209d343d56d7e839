"""Reconnecting: the server restarts or goes silent mid-stream, and the caller sees every token once."""

from __future__ import annotations

import asyncio

import pytest
from scripted_scheduler import ScriptedScheduler, expected_text, expected_tokens

from pagedserve.shared.sdk import AsyncClient, Client

pytestmark = pytest.mark.timeout(20)

FAST = {"heartbeat_s": 0.05, "reconnect_after_s": 0.3, "timeout_s": 5.0}


def test_after_a_server_restart_the_stream_goes_on_without_gap_or_repeat() -> None:
    with (
        ScriptedScheduler(token_interval_s=0.01, crash_after_tokens=3, downtime_s=0.2) as server,
        Client(server.endpoint, **FAST) as client,
    ):
        stream = client.stream("restart me", max_tokens=8, request_id="r1")
        deltas = list(stream)
        assert [t for d in deltas for t in d.token_ids] == expected_tokens("restart me", 8)
        assert "".join(d.text for d in deltas) == expected_text("restart me", 8)
        assert server.incarnation == 1
        resubmits = [m for inc, _, m in server.received if inc == 1 and m["type"] == "submit"]
        # Re-submitted by id, attached; on loaded cores the new connection may stay silent past
        # reconnect_after_s and the SDK re-submits once more, which the stream above must survive.
        assert resubmits and all((m["request_id"], m["attach"]) == ("r1", True) for m in resubmits)


def test_a_dropped_connection_is_noticed_at_once_not_after_silence() -> None:
    # A restarted server answers pings on the old socket (ZeroMQ reconnects TCP by itself), so
    # silence alone would never tell: the socket monitor's "disconnected" must.
    # The request's timeout is far below the silence limit: a reconnect driven by silence would come
    # after the request had failed "timeout", so a complete stream shows the disconnect was seen.
    silence_s, timeout_s = 600.0, 20.0
    with (
        ScriptedScheduler(token_interval_s=0.01, crash_after_tokens=2, downtime_s=0.05) as server,
        Client(server.endpoint, heartbeat_s=0.05, reconnect_after_s=silence_s, timeout_s=timeout_s) as client,
    ):
        assert [t for d in client.stream("blink", max_tokens=5) for t in d.token_ids] == expected_tokens(
            "blink", 5
        )
        assert server.incarnation == 1


def test_after_a_server_restart_generate_returns_the_recomputed_result() -> None:
    with (
        ScriptedScheduler(token_interval_s=0.01, crash_after_tokens=2, downtime_s=0.1) as server,
        Client(server.endpoint, **FAST) as client,
    ):
        # Non-streaming requests send no deltas: the crash is triggered by a streaming neighbour.
        neighbour = client.stream("neighbour", max_tokens=6)
        assert client.generate("plain", max_tokens=6).token_ids == expected_tokens("plain", 6)
        assert [t for d in neighbour for t in d.token_ids] == expected_tokens("neighbour", 6)


def test_a_silent_connection_is_replaced_and_the_live_request_replayed() -> None:
    # The server keeps generating but stops talking to the old connection: only silence tells.
    with (
        ScriptedScheduler(token_interval_s=0.05, mute_after_tokens=3) as server,
        Client(server.endpoint, **FAST) as client,
    ):
        deltas = list(client.stream("dark", max_tokens=14, request_id="d1"))
        assert [t for d in deltas for t in d.token_ids] == expected_tokens("dark", 14)
        assert "".join(d.text for d in deltas) == expected_text("dark", 14)
        assert [m.get("attach") for m in server.messages("submit")] == [False, True]


def test_a_request_that_finished_while_disconnected_is_completed_from_its_stored_result() -> None:
    with (
        ScriptedScheduler(token_interval_s=0.005, mute_after_tokens=2) as server,
        Client(server.endpoint, **FAST) as client,
    ):
        stream = client.stream("quick", max_tokens=6)
        deltas = list(stream)
        assert [t for d in deltas for t in d.token_ids] == expected_tokens("quick", 6)
        assert "".join(d.text for d in deltas) == expected_text("quick", 6)
        assert stream.result is not None and stream.result.finish_reason == "length"
        assert [m.get("attach") for m in server.messages("submit")] == [False, True]


def test_async_client_reconnects_after_a_server_restart() -> None:
    async def main(endpoint: str) -> list[int]:
        async with AsyncClient(endpoint, **FAST) as client:
            return [t async for d in client.stream("async restart", max_tokens=8) for t in d.token_ids]

    with ScriptedScheduler(token_interval_s=0.01, crash_after_tokens=3, downtime_s=0.2) as server:
        assert asyncio.run(main(server.endpoint)) == expected_tokens("async restart", 8)
        assert server.incarnation == 1
