"""Every message type that crosses a socket survives encode -> msgpack -> decode -> read unchanged."""

from __future__ import annotations

import msgspec
import pytest

from pagedserve.shared.protocol.blocks import (
    UNCHANGED,
    Alloc,
    Allocation,
    BlockBatch,
    BlockReply,
    Forked,
    Free,
    Grow,
    OpError,
)
from pagedserve.shared.protocol.codec import ProtocolError, decode
from pagedserve.shared.protocol.constraints import StructuredOutputs
from pagedserve.shared.protocol.control import (
    DumpStacks,
    Heartbeat,
    Hello,
    PoolInfo,
    Pools,
    PoolsReply,
    Register,
    Registered,
    RenewOwner,
    Reset,
)
from pagedserve.shared.protocol.frontend import (
    Abort,
    Accepted,
    CompletionOutput,
    Delta,
    Error,
    Finished,
    Locate,
    Location,
    Ping,
    Pong,
    SamplingParams,
    StopAt,
    Submit,
    Usage,
)
from pagedserve.shared.protocol.messages import MESSAGES, encode_message, message_table, read_message
from pagedserve.shared.protocol.prompt_logprobs import PackedPromptLogprobs, PromptLogprobs, pack_floats
from pagedserve.shared.protocol.step import (
    CachedRequest,
    Execute,
    ExecuteMessage,
    Fork,
    NewRequest,
    Speculated,
    StepResult,
    StepResultMessage,
    WorkerSampling,
)

# A 3-token prompt with top-2: two positions (the first token has no logprob).
PACKED = PackedPromptLogprobs(
    "a",
    2,
    pack_floats([-1.5, -0.25]),
    bytes([7, 0, 0, 0, 9, 0, 0, 0, 8, 0, 0, 0, 5, 0, 0, 0]),
    pack_floats([-0.5, -1.5, -0.25, -3.0]),
)
PROMPT_LOGPROBS = PromptLogprobs.of([4, 9, 8], PACKED)

ANNOUNCEMENT = (
    "w0",
    "inc-1",
    64,
    16,
    2048,
    "/models/tiny",
    {"dtype": "float32", "isa_layer_ops": "avx2"},
)

EXAMPLES = [
    Submit(request_id="r1", prompt="hi", sampling=SamplingParams(n=2, stop=["\n"], seed=3)),
    Abort(request_id="r1"),
    Ping(),
    StopAt(request_id="r1", index=1, num_tokens=7),
    Locate(request_id="r1"),
    Accepted(request_id="r1", num_prompt_tokens=3),
    Delta(request_id="r1", index=1, offset=4, text_offset=9, token_ids=[5], text="é", logprobs=[[-0.1, []]]),
    Finished(
        request_id="r1",
        outputs=[CompletionOutput(index=0, token_ids=[5, 6], text="ab", finish_reason="stop")],
        usage=Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=1),
    ),
    Finished(
        request_id="r2",
        outputs=[CompletionOutput(index=0, token_ids=[5], text="a", finish_reason="length")],
        usage=Usage(prompt_tokens=3, completion_tokens=1),
        prompt_logprobs=PROMPT_LOGPROBS,
    ),
    Delta(request_id="r2", token_ids=[5], text="a", prompt_logprobs=PROMPT_LOGPROBS),
    Error(code="too_large", message="frame of 9 bytes exceeds the limit of 8 bytes", request_id=None),
    Pong(),
    Location(request_id="r1", state="live"),
    Hello(*ANNOUNCEMENT),
    Heartbeat(*ANNOUNCEMENT),
    Register(*ANNOUNCEMENT),
    Registered("w0", "bm-instance"),
    Reset(generation=1 << 39),
    DumpStacks(step_age_s=12.5),
    RenewOwner("scheduler-1:0"),
    Pools(7),
    PoolsReply(7, {"w0": PoolInfo(64, 16, "inc-1")}, "bm-instance"),
    ExecuteMessage(
        Execute(
            step=3,
            new_requests=[
                NewRequest(
                    "a",
                    [1, 2, 3],
                    3,
                    0,
                    3,
                    [0],
                    WorkerSampling.of(
                        SamplingParams(
                            temperature=0.0,
                            logit_bias={5: 1.5},
                            structured_outputs=StructuredOutputs(regex="a+"),
                        ),
                        7,
                    ),
                )
            ],
            cached_requests=[CachedRequest("b", 1, [4], [(0, 5)]), CachedRequest("d", 1, num_lookahead=4)],
            finished_ids=["c"],
            copies=[(1, 5)],
            forks=[Fork("a", "a#1", 11)],
        )
    ),
    StepResultMessage(
        "w0",
        StepResult(3, ["a", "a#1"], [7, 8], [None, [-0.5, [[8, -0.5]]]], {"step_s": 0.01}),
        generation=(1 << 39) + 2,
    ),
    StepResultMessage("w0", StepResult(4, ["a"], [7], None, {}, [PACKED])),
    StepResultMessage(
        "w0",
        StepResult(5, ["a", "d"], [7, 9], None, {}, [], [Speculated(1, 4, [10, 11]), Speculated(0, 2, [])]),
    ),
    BlockBatch(
        9, [Alloc("w0", "a", "s:0", [1, 2, 3], 3, cache_namespace="sql@1"), Grow("b", 1, [4]), Free("c")]
    ),
    BlockReply(
        9,
        [Allocation([0], 0, 3), UNCHANGED, Forked(), None, OpError("grow: unknown request 'x'")],
        {"w0": 61},
        "bm-1",
    ),
]


def test_the_examples_cover_every_declared_message_type():
    tags = {m.type if hasattr(m, "model_dump") else m.TYPE for m in EXAMPLES}
    assert tags == set(MESSAGES)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_message_round_trips_through_the_wire(message):
    frame = decode(encode_message(message))
    assert frame["v"] == 1
    assert read_message(frame, MESSAGES) == message


@pytest.mark.parametrize(
    ("message", "field", "value"),
    [
        (Heartbeat(*ANNOUNCEMENT), "num_blocks", "64"),
        (Register(*ANNOUNCEMENT), "block_size", 0),
        (Hello(*ANNOUNCEMENT), "incarnation", None),
        (RenewOwner("s"), "owner", 5),
        (Pools(1), "seq", "1"),
        (BlockBatch(1, []), "ops", {}),
    ],
)
def test_a_control_message_with_a_bad_field_is_refused_naming_the_field(message, field, value):
    frame = decode(encode_message(message))
    body = msgspec.msgpack.decode(frame["body"])
    body[field] = value
    frame["body"] = msgspec.msgpack.encode(body)
    with pytest.raises(ProtocolError, match=rf"\$\.{field}") as info:
        read_message(frame)
    assert info.value.code == "bad_fields"


def test_a_frame_whose_body_is_no_msgpack_bytes_is_refused():
    frame = decode(encode_message(Pools(1)))
    frame["body"] = {"seq": 1}
    with pytest.raises(ProtocolError, match="body") as info:
        read_message(frame)
    assert info.value.code == "bad_frame"


def test_a_step_with_a_badly_typed_field_is_refused_naming_where():
    frame = decode(encode_message(ExecuteMessage(Execute(step=1, cached_requests=[CachedRequest("b", 1)]))))
    frame["body"] = msgspec.msgpack.encode({"execute": [1, [], [["b", "one", [], []]], [], [], []]})
    with pytest.raises(ProtocolError, match=r"\$\.execute\[2\]\[0\]\[1\]") as info:
        read_message(frame)
    assert info.value.code == "bad_fields"


def test_a_receiver_refuses_a_type_it_does_not_take_naming_what_it_takes():
    frame = decode(encode_message(Reset()))
    with pytest.raises(ProtocolError, match="heartbeat") as info:
        read_message(frame, message_table(Heartbeat))
    assert info.value.code == "unknown_type"


def test_prompt_logprobs_unpack_to_one_entry_per_prompt_token_the_first_empty():
    assert PROMPT_LOGPROBS.logprobs() == [None, -1.5, -0.25]
    assert PROMPT_LOGPROBS.top() == [[], [(7, -0.5), (9, -1.5)], [(8, -0.25), (5, -3.0)]]


def test_prompt_logprobs_whose_sizes_disagree_with_the_prompt_are_refused():
    fields = PROMPT_LOGPROBS.model_dump()
    with pytest.raises(ValueError, match="2 positions x 2"):
        PromptLogprobs.model_validate({**fields, "token_logprobs": fields["token_logprobs"][:4]})


def test_worker_sampling_takes_every_value_from_the_sampling_params_but_the_seed() -> None:
    params = SamplingParams(
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        min_p=0.1,
        seed=11,
        repetition_penalty=1.3,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        min_tokens=2,
        stop_token_ids=[9],
        logprobs=3,
        logit_bias={4: -2.0},
        prompt_logprobs=2,
    )
    sampling = WorkerSampling.of(params, seed=99)  # a child of n > 1 has a seed of its own

    assert sampling.seed == 99
    for name in WorkerSampling.__struct_fields__:
        if name != "seed":
            assert getattr(sampling, name) == getattr(params, name), name
