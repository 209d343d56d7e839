"""The blocking Client against a scripted ROUTER over real TCP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pydantic
import pytest
import zmq.auth
from scripted_scheduler import ScriptedScheduler, expected_text, expected_tokens

from pagedserve.shared.sdk import Client, RequestError, Result, StreamDelta, load_client_keys

pytestmark = pytest.mark.timeout(20)

FAST = {"heartbeat_s": 0.05, "reconnect_after_s": 0.3, "timeout_s": 5.0}


@pytest.fixture
def server() -> Iterator[ScriptedScheduler]:
    with ScriptedScheduler() as s:
        yield s


@pytest.fixture
def client(server: ScriptedScheduler) -> Iterator[Client]:
    with Client(server.endpoint, **FAST) as c:
        yield c


def test_generate_returns_text_tokens_and_usage(client: Client) -> None:
    result = client.generate("hello there", max_tokens=5, temperature=0.0)
    assert isinstance(result, Result)
    assert result.token_ids == expected_tokens("hello there", 5)
    assert result.text == expected_text("hello there", 5)
    assert result.finish_reason == "length"
    assert result.num_prompt_tokens == 2
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (2, 5)


def test_generate_takes_prompt_token_ids_and_returns_all_n_outputs(client: Client) -> None:
    result = client.generate(prompt_token_ids=[1, 2, 3], max_tokens=4, n=2, request_id="ids-1")
    assert result.request_id == "ids-1"
    assert [o.index for o in result.outputs] == [0, 1]
    assert result.outputs[1].token_ids == expected_tokens(None, 4, index=1, prompt_token_ids=[1, 2, 3])
    assert result.num_prompt_tokens == 3


def test_stream_yields_deltas_in_order_then_holds_the_result(client: Client) -> None:
    stream = client.stream("once upon", max_tokens=6)
    deltas = list(stream)
    assert all(isinstance(d, StreamDelta) and d.request_id == stream.request_id for d in deltas)
    assert [t for d in deltas for t in d.token_ids] == expected_tokens("once upon", 6)
    assert "".join(d.text for d in deltas) == expected_text("once upon", 6)
    assert stream.result is not None and stream.result.token_ids == expected_tokens("once upon", 6)


def test_concurrent_requests_from_threads_reach_their_callers(client: Client) -> None:
    results: dict[int, Result | str] = {}

    def run(i: int) -> None:
        if i % 2:
            results[i] = client.generate(f"prompt {i}", max_tokens=2 + i % 5)
        else:
            results[i] = "".join(d.text for d in client.stream(f"prompt {i}", max_tokens=2 + i % 5))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    for i in range(24):
        text = expected_text(f"prompt {i}", 2 + i % 5)
        got = results[i]
        assert (got.text if isinstance(got, Result) else got) == text


def test_server_error_raises_request_error_with_its_code(client: Client) -> None:
    with pytest.raises(RequestError) as info:
        client.generate("error:no_workers", request_id="doomed")
    assert (info.value.code, info.value.request_id) == ("no_workers", "doomed")


def test_a_live_request_id_cannot_be_used_twice(client: Client) -> None:
    stream = client.stream("hang", request_id="same")
    with pytest.raises(RequestError) as info:
        client.generate("hang", request_id="same")
    assert info.value.code == "duplicate_request_id"
    stream.close()


def test_unknown_sampling_field_fails_before_anything_is_sent(
    server: ScriptedScheduler, client: Client
) -> None:
    with pytest.raises(pydantic.ValidationError, match="max_tokenz"):
        client.generate("hi", max_tokenz=3)
    client.generate("after", max_tokens=1)  # a later request proves the wire was quiet, not slow
    assert [m["prompt"] for m in server.messages("submit")] == ["after"]


def test_pings_flow_while_a_request_is_live_even_if_nobody_reads(
    server: ScriptedScheduler, client: Client
) -> None:
    client.generate("warm up", max_tokens=1)
    time.sleep(0.2)
    assert server.messages("ping") == []  # no live request: no heartbeat
    stream = client.stream("hang")  # submitted; the caller does not read it
    time.sleep(0.4)
    assert len(server.messages("ping")) >= 4
    stream.close()


def test_request_past_its_timeout_raises_timeout_and_aborts(
    server: ScriptedScheduler, client: Client
) -> None:
    with pytest.raises(RequestError) as info:
        client.generate("hang", timeout_s=0.2, request_id="slow")
    assert info.value.code == "timeout"
    assert "timeout_s=0.2" in str(info.value)  # its own timeout, not the client's default
    assert server.wait_for("abort")[0]["request_id"] == "slow"


def test_abort_sends_abort_and_the_result_says_abort(server: ScriptedScheduler, client: Client) -> None:
    stream = client.stream("hang", request_id="stop-me")
    server.wait_for("submit")
    client.abort("stop-me")
    assert list(stream) == []
    assert stream.result is not None and stream.result.finish_reason == "abort"
    assert server.messages("abort") == [{"v": 1, "type": "abort", "request_id": "stop-me"}]


def test_leaving_a_stream_early_aborts_it(server: ScriptedScheduler, client: Client) -> None:
    for _ in client.stream("long story", max_tokens=500, request_id="bored"):
        break
    assert server.wait_for("abort")[0]["request_id"] == "bored"


def test_close_joins_the_io_thread_and_fails_live_requests(server: ScriptedScheduler) -> None:
    client = Client(server.endpoint, **FAST)
    errors: list[RequestError] = []

    def wait_forever() -> None:
        try:
            client.generate("hang")
        except RequestError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait_forever)
    waiter.start()
    server.wait_for("submit")
    client.close()
    waiter.join(timeout=FAST["timeout_s"] * 4)
    assert not waiter.is_alive() and not client._thread.is_alive()
    assert [e.code for e in errors] == ["closed"]  # failed by close, not by its timeout ("timeout")
    with pytest.raises(RequestError, match="closed"):
        client.generate("too late")


def test_curve_keys_encrypt_the_connection(tmp_path: object) -> None:
    zmq.auth.create_certificates(str(tmp_path), "server")
    zmq.auth.create_certificates(str(tmp_path), "client")
    public, secret = zmq.auth.load_certificate(f"{tmp_path}/server.key_secret")
    with (
        ScriptedScheduler(curve_public_key=public, curve_secret_key=secret) as server,
        Client(server.endpoint, **FAST, **load_client_keys(tmp_path)) as client,  # type: ignore[arg-type]
    ):
        assert client.generate("secret", max_tokens=2).text == expected_text("secret", 2)
        # The server's key alone also works: the client then uses a throwaway key pair.
        with Client(server.endpoint, **FAST, curve_server_public_key=public) as anonymous:
            assert anonymous.generate("anon", max_tokens=1).text == expected_text("anon", 1)
