"""A prompt's own token logprobs (`SamplingParams.prompt_logprobs`; echo + logprobs in the API).

Position i (1 <= i < P) holds log p(prompt[i] | prompt[:i]) under the model's raw logits (nothing of
the sampling params applies: the prompt was not sampled) and the `num_top` most likely tokens there.
Position 0 has none: nothing precedes it. The arrays travel packed, as little-endian float32 / int32
bytes: a 4,096-token prompt with num_top=5 is 98 KB, where lists of msgpack floats would be twice
that and one dict per token ten times.

Two wire forms: `PackedPromptLogprobs` (worker -> scheduler, in StepResult; the scheduler knows the
prompt) and `PromptLogprobs` (scheduler -> client, in Delta / Finished; it names the prompt's tokens).
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict, model_validator


def _unpack(data: bytes, code: str) -> list[Any]:
    values = array(code, data)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def pack_floats(values: list[float]) -> bytes:
    """float32, little-endian (what the worker sends; tests build expected values with it)."""
    packed = array("f", values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


class PackedPromptLogprobs(msgspec.Struct, array_like=True):
    """Worker -> scheduler: one request's prompt logprobs, sent with its first sampled token."""

    request_id: str
    num_top: int
    token_logprobs: bytes  # float32 [P-1]
    top_token_ids: bytes  # int32 [P-1, num_top]
    top_logprobs: bytes  # float32 [P-1, num_top]


class PromptLogprobs(BaseModel):
    """Scheduler -> client: the prompt's tokens and their logprobs (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token_ids: list[int]  # the prompt, P tokens
    num_top: int
    token_logprobs: bytes
    top_token_ids: bytes
    top_logprobs: bytes

    @model_validator(mode="after")
    def _sizes_agree(self) -> PromptLogprobs:
        positions = max(len(self.token_ids) - 1, 0)
        want = (4 * positions, 4 * positions * self.num_top, 4 * positions * self.num_top)
        got = (len(self.token_logprobs), len(self.top_token_ids), len(self.top_logprobs))
        if got != want:
            raise ValueError(
                f"prompt_logprobs: {positions} positions x {self.num_top} need {want} bytes, got {got}"
            )
        return self

    @classmethod
    def of(cls, prompt: list[int], packed: PackedPromptLogprobs) -> PromptLogprobs:
        return cls.model_construct(
            token_ids=prompt,
            num_top=packed.num_top,
            token_logprobs=packed.token_logprobs,
            top_token_ids=packed.top_token_ids,
            top_logprobs=packed.top_logprobs,
        )

    def logprobs(self) -> list[float | None]:
        """One per prompt token; the first is None."""
        return [None, *_unpack(self.token_logprobs, "f")]

    def top(self) -> list[list[tuple[int, float]]]:
        """One list per prompt token of (token id, logprob), most likely first; the first is empty."""
        k = self.num_top
        if k == 0:
            return [[] for _ in self.token_ids]
        ids, values = _unpack(self.top_token_ids, "i"), _unpack(self.top_logprobs, "f")
        return [[]] + [
            list(zip(ids[i : i + k], values[i : i + k], strict=True)) for i in range(0, len(ids), k)
        ]
