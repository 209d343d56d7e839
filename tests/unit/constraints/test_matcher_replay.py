"""The grammar matcher against live decoding: the mask never forbids every token, and a matcher
rebuilt by replaying the accepted tokens is where live decoding had it (the same masks from there on),
as is a forked one."""

from __future__ import annotations

import pytest
import torch
from harness.tiny_models import EOS_ID, VOCAB_SIZE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedserve.services.constraints.compiler import ConstraintCompiler
from pagedserve.services.constraints.matcher import SequenceMatcher, apply_mask, build_mask
from pagedserve.shared.protocol.constraints import StructuredOutputs

SPECS = [
    StructuredOutputs(
        json={
            "type": "object",
            "properties": {
                "n": {"type": "integer"},
                "s": {"type": "string", "maxLength": 5},
                "b": {"type": "boolean"},
            },
            "required": ["n", "s"],
        }
    ),
    StructuredOutputs(json_object=True),
    StructuredOutputs(regex="(ab|c)+[0-9]{2,5}"),
    StructuredOutputs(choice=["alpha", "beta", "gamma"]),
    StructuredOutputs(grammar='root ::= "(" item ("," item)* ")"\nitem ::= [a-z]+ | root'),
]


@pytest.fixture(scope="module")
def compiler(tiny_model) -> ConstraintCompiler:
    return ConstraintCompiler.for_model(tiny_model("llama"), VOCAB_SIZE, [EOS_ID])


def allowed(matcher: SequenceMatcher) -> list[int]:
    mask = build_mask([matcher], VOCAB_SIZE)
    assert mask is not None
    logits = torch.zeros(1, VOCAB_SIZE)
    apply_mask(logits, mask)
    return torch.nonzero(logits[0] == 0).flatten().tolist()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec_index=st.integers(0, len(SPECS) - 1), picks=st.lists(st.integers(0, 10**6), max_size=40))
def test_mask_never_empty_and_replay_equals_live_decoding(compiler, spec_index, picks):
    compiled = compiler.compile(SPECS[spec_index])
    live = SequenceMatcher.start(compiled)
    accepted: list[int] = []
    for pick in picks:
        if live.finished:
            break
        choices = allowed(live)
        assert choices, f"the mask forbids every token after {accepted}"
        assert all(t < VOCAB_SIZE for t in choices)
        token = choices[pick % len(choices)]
        live.accept(token)
        accepted.append(token)
    replayed = SequenceMatcher.start(compiled, accepted)
    assert replayed.finished == live.finished
    assert replayed.num_accepted == live.num_accepted
    if not live.finished:
        assert allowed(replayed) == allowed(live)
        fork = live.fork()
        assert allowed(fork) == allowed(live)


def test_only_stop_tokens_are_allowed_once_the_grammar_is_complete(compiler):
    matcher = SequenceMatcher.start(compiler.compile(StructuredOutputs(choice=["yes"])))
    tokenizer_ids = [compiler.info.decoded_vocab.index(b"y"), compiler.info.decoded_vocab.index(b"e")]
    tokenizer_ids.append(compiler.info.decoded_vocab.index(b"s"))
    for token in tokenizer_ids:
        matcher.accept(token)
    assert allowed(matcher) == [EOS_ID]
    matcher.accept(EOS_ID)
    assert matcher.finished
    assert build_mask([matcher], VOCAB_SIZE) is None  # a finished row is unconstrained: costs nothing


def test_a_second_compile_of_the_same_constraint_is_a_cache_hit(compiler):
    spec = StructuredOutputs(json={"type": "object", "properties": {"z": {"type": "integer"}}})
    same = StructuredOutputs(json={"properties": {"z": {"type": "integer"}}, "type": "object"})
    first = compiler.compile(spec)
    hits = compiler.hits
    assert compiler.compile(same) is first
    assert compiler.hits == hits + 1


def test_unconstrained_rows_are_left_alone_by_the_mask(compiler):
    constrained = SequenceMatcher.start(compiler.compile(StructuredOutputs(regex="[0-9]+")))
    mask = build_mask([None, constrained, None], VOCAB_SIZE)
    assert mask is not None and mask.rows == [1]
    logits = torch.randn(3, VOCAB_SIZE)
    before = logits.clone()
    apply_mask(logits, mask)
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert torch.isinf(logits[1]).sum() == VOCAB_SIZE - 10
