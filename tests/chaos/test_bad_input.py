"""Bad input on the front socket: each malformed frame gets one Error naming the problem, is counted,
and changes nothing else — good requests streaming beside them finish with the right tokens."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import msgpack
import pytest
import zmq
from harness.deployment import get_text, start
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from pagedserve import LLM, Client, SamplingParams
from pagedserve.services.scheduler.admission import RequestRejected
from pagedserve.services.scheduler.frontdoor import parse_client_message
from pagedserve.shared.protocol.codec import ProtocolError, decode, encode

MAX_BYTES = 256 * 1024
GOOD_PROMPTS = [[5 + i, 40 + i, 77, 100 + 2 * i] * (1 + i % 5) for i in range(12)]


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


@pytest.fixture(scope="module")
def deployment(model_path, tmp_path_factory):
    sup = start(
        model_path,
        workers=1,
        log_dir=tmp_path_factory.mktemp("fuzz-logs"),
        max_message_bytes=MAX_BYTES,
        max_inflight_per_client=3,
        admin_token="s3cret",
    )
    yield sup
    sup.stop()


class FrontProbe:
    """One raw DEALER: send a frame, read the one reply."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def ask(self, frame: bytes, timeout_s: float = 10.0) -> dict:
        """The reply to `frame`; the final answer of the one live request sharing this socket is skipped."""
        self.sock.send(frame)
        while True:
            assert self.sock.poll(int(timeout_s * 1000)), "no reply to a bad frame"
            reply = decode(self.sock.recv())
            if reply.get("request_id") != "long-live" or reply.get("type") == "error":
                return reply

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def is_valid_client_frame(frame: bytes) -> bool:
    try:
        parse_client_message(decode(frame, MAX_BYTES))
        return True
    except (ProtocolError, RequestRejected):
        return False


def valid_submit(request_id: str = "fuzz") -> dict:
    return {
        "v": 1,
        "type": "submit",
        "request_id": request_id,
        "prompt_token_ids": [5, 6, 7],
        "sampling": {"temperature": 0.0, "max_tokens": 4},
    }


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=8,
)


def mutate(mutation: str, value) -> bytes:
    msg = valid_submit(f"fuzz-{abs(hash(repr(value))) % 10**9}")
    if mutation == "wrong_type_field":
        msg[value[0]] = value[1]
    elif mutation == "missing_field":
        msg.pop(value, None)
    elif mutation == "unknown_type":
        msg["type"] = value
    elif mutation == "bad_sampling":
        msg["sampling"] = {**msg["sampling"], **value}
    elif mutation == "bad_version":
        msg["v"] = value
    return msgpack.packb(msg, use_bin_type=True)


bad_frames = st.one_of(
    st.binary(max_size=200),  # not msgpack, or not a map
    st.builds(lambda v: msgpack.packb(v, use_bin_type=True), json_like),  # msgpack of anything
    st.builds(
        mutate,
        st.just("wrong_type_field"),
        st.tuples(
            st.sampled_from(["request_id", "prompt_token_ids", "sampling", "prompt", "stream"]), json_like
        ),
    ),
    st.builds(mutate, st.just("missing_field"), st.sampled_from(["request_id", "prompt_token_ids", "type"])),
    st.builds(mutate, st.just("unknown_type"), st.text(max_size=12)),
    st.builds(mutate, st.just("bad_version"), json_like),
    st.builds(
        mutate,
        st.just("bad_sampling"),
        st.one_of(
            st.fixed_dictionaries(
                {"max_tokens": st.integers(min_value=-(2**63), max_value=0)}
            ),  # negative or zero
            st.fixed_dictionaries({"max_tokens": st.integers(min_value=10**7, max_value=2**62)}),  # huge
            st.fixed_dictionaries({"temperature": st.floats(max_value=-0.01)}),
            st.fixed_dictionaries({"top_p": st.floats(min_value=1.01, max_value=1e9)}),
            st.dictionaries(
                st.text(min_size=1, max_size=12).filter(lambda k: k not in SamplingParams.model_fields),
                json_like,
                min_size=1,
                max_size=2,
            ),  # unknown sampling fields
        ),
    ),
    st.builds(
        lambda ids: encode("submit", {"request_id": "oov", "prompt_token_ids": ids}),
        st.lists(st.integers(min_value=320, max_value=2**31), min_size=1, max_size=5),
    ),  # outside vocab
    st.builds(
        lambda n: encode("submit", {"request_id": "too-long", "prompt_token_ids": [5] * n}),
        st.integers(min_value=512, max_value=700),
    ),  # longer than the model's context
)


def test_malformed_frames_each_get_an_error_while_good_requests_finish(deployment, model_path):
    sup = deployment
    scheduler_pid = sup.pid("scheduler")
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    expected = [o.token_ids for o in LLM(str(model_path), num_blocks=256).generate(GOOD_PROMPTS, params)]
    got: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def good_traffic() -> None:
        try:
            with Client(sup.front_endpoint, timeout_s=120) as client:
                for i, prompt in enumerate(GOOD_PROMPTS):
                    got[i] = client.generate(
                        prompt_token_ids=prompt,
                        max_tokens=40,
                        temperature=0.0,
                        ignore_eos=True,
                        request_id=f"good-{i}",
                    ).token_ids
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    probe = FrontProbe(sup.front_endpoint)
    counted_before = rejected_total(sup)
    sent = 0
    # A live request whose id is then reused: the duplicate must be refused while it runs.
    probe.sock.send(
        encode(
            "submit",
            {
                "request_id": "long-live",
                "prompt_token_ids": [5, 6, 7],
                "sampling": {"temperature": 0.0, "max_tokens": 400, "ignore_eos": True},
                "stream": False,
            },
        )
    )
    assert decode(probe.sock.recv())["type"] == "accepted"
    dup = probe.ask(encode("submit", {"request_id": "long-live", "prompt_token_ids": [5]}))
    assert dup["type"] == "error" and dup["code"] == "duplicate_request_id", dup
    too_big = probe.ask(encode("submit", {"request_id": "big", "prompt": "x" * (MAX_BYTES + 1000)}))
    assert (
        too_big["type"] == "error" and too_big["code"] == "too_large" and str(MAX_BYTES) in too_big["message"]
    )
    sent += 2

    traffic = threading.Thread(target=good_traffic)
    traffic.start()

    @settings(
        max_examples=1600,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(frame=bad_frames)
    def each_bad_frame_gets_an_error(frame: bytes) -> None:
        nonlocal sent
        if is_valid_client_frame(frame):
            return  # hypothesis built a well-formed message (e.g. a ping): not what this test is about
        reply = probe.ask(frame)
        assert reply.get("type") == "error", reply
        assert reply["code"] and reply["message"]
        sent += 1

    each_bad_frame_gets_an_error()
    traffic.join(timeout=180)
    probe.close()
    assert not errors, errors
    assert [got[i] for i in range(len(GOOD_PROMPTS))] == expected
    assert sent >= 1000, f"only {sent} bad frames were sent"
    assert rejected_total(sup) - counted_before >= sent
    assert sup.pid("scheduler") == scheduler_pid and sup.restarts("scheduler") == 0


def rejected_total(sup) -> float:
    text = get_text(f"{sup.scheduler_ops_url}/metrics")
    for family in text_string_to_metric_families(text):
        if family.name == "pagedserve_requests_rejected":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


def test_error_names_the_field_and_the_limit(deployment):
    probe = FrontProbe(deployment.front_endpoint)
    try:
        reply = probe.ask(mutate("bad_sampling", {"max_tokens": -5}))
        assert reply["code"] == "invalid_request" and "sampling.max_tokens" in reply["message"]
        assert "1" in reply["message"]  # the bound (ge=1)
        reply = probe.ask(encode("submit", {"request_id": "ctx", "prompt_token_ids": [5] * 600}))
        assert reply["code"] == "prompt_too_long" and "512" in reply["message"]
        reply = probe.ask(
            encode(
                "submit",
                {"request_id": "ctx2", "prompt_token_ids": [5] * 10, "sampling": {"max_tokens": 600}},
            )
        )
        assert reply["code"] == "max_tokens_too_large" and "max_model_len=512" in reply["message"]
        reply = probe.ask(encode("submit", {"request_id": "voc", "prompt_token_ids": [5, 999]}))
        assert (
            reply["code"] == "token_out_of_vocab" and "999" in reply["message"] and "320" in reply["message"]
        )
    finally:
        probe.close()
    time.sleep(0.1)


def test_a_client_past_its_inflight_limit_gets_a_clear_error(deployment):
    probe = FrontProbe(deployment.front_endpoint)
    try:
        for i in range(3):
            probe.sock.send(
                encode(
                    "submit",
                    {
                        "request_id": f"limit-{i}",
                        "prompt_token_ids": [5, 6, 7],
                        "sampling": {"max_tokens": 300, "ignore_eos": True},
                        "stream": False,
                    },
                )
            )
        accepted = [decode(probe.sock.recv())["type"] for _ in range(3)]
        assert accepted == ["accepted"] * 3
        reply = probe.ask(encode("submit", {"request_id": "limit-3", "prompt_token_ids": [5, 6, 7]}))
        assert reply["code"] == "too_many_requests" and "max_inflight_per_client=3" in reply["message"]
        for i in range(3):
            probe.sock.send(encode("abort", {"request_id": f"limit-{i}"}))
    finally:
        probe.close()


def test_ops_endpoints_are_read_only_without_the_admin_token(deployment):
    url = f"{deployment.block_manager_ops_url}/admin/reap"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        request = urllib.request.Request(url, method="POST", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403
    request = urllib.request.Request(url, method="POST", headers={"Authorization": "Bearer s3cret"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200 and "reclaimed" in json.loads(resp.read())
