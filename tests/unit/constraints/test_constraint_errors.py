"""A bad constraint is refused before anything is queued, naming its field, in the SDK's and the
in-process engine's path (the scheduler's admission check)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pagedserve.services.scheduler.admission import RequestRejected, check_request
from pagedserve.shared.protocol.constraints import StructuredOutputs
from pagedserve.shared.protocol.frontend import SamplingParams


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"regex": "(("}, "structured_outputs.regex", "parenthesis"),
        ({"json": {"type": "objectx"}}, "structured_outputs.json", "objectx"),
        ({"json": "{not json"}, "structured_outputs.json", ""),
        ({"grammar": "root ::= nowhere"}, "structured_outputs.grammar", "nowhere"),
    ],
)
def test_a_constraint_that_does_not_parse_is_refused_naming_its_field(spec, field, words):
    params = SamplingParams(structured_outputs=spec)
    with pytest.raises(RequestRejected) as caught:
        check_request([5, 6], params, 512, 320)
    assert caught.value.code == "invalid_constraint"
    assert caught.value.message.startswith(f"sampling.{field}: ")
    assert words in caught.value.message


def test_a_constraint_needs_a_tokenizer():
    with pytest.raises(RequestRejected, match="needs a tokenizer"):
        check_request(
            [5], SamplingParams(structured_outputs={"regex": "a"}), 512, 320, can_stop_on_strings=False
        )


def test_exactly_one_kind_and_no_ignore_eos():
    with pytest.raises(ValidationError, match="exactly one"):
        StructuredOutputs(regex="a", choice=["a"])
    with pytest.raises(ValidationError, match="exactly one"):
        StructuredOutputs()
    with pytest.raises(ValidationError, match="ignore_eos"):
        SamplingParams(structured_outputs={"regex": "a"}, ignore_eos=True)


def test_logit_bias_outside_the_vocabulary_is_refused():
    with pytest.raises(RequestRejected, match="logit_bias names token 999"):
        check_request([5], SamplingParams(logit_bias={999: 1.0}), 512, 320)
