"""`--speculative-config`: how a deployment proposes tokens for speculative decoding (vLLM's JSON shape).

    --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
    --speculative-config '{"method": "suffix", "num_speculative_tokens": 6}'

The field names are vLLM's where vLLM has one (`method`, `num_speculative_tokens`, `prompt_lookup_*`,
`suffix_decoding_*`, `disable_by_batch_size`, `model`); `max_step_rows`, `row_cost` and `adaptive` are ours
(docs/speculative-decoding.md). The scheduler reads the budget (how many proposals, in which steps),
the worker the proposer.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

METHODS = ("ngram", "suffix", "draft_model")


class SpeculativeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["ngram", "suffix", "draft_model"] = Field(
        "ngram",
        description="ngram = prompt lookup over the request's own tokens; suffix = also the outputs of "
        "earlier requests on the worker; draft_model = a small model with the same tokenizer",
    )
    num_speculative_tokens: int = Field(4, ge=1, le=16, description="most tokens proposed per step")
    prompt_lookup_max: int = Field(4, ge=1, le=32, description="longest n-gram matched (ngram, suffix)")
    prompt_lookup_min: int = Field(2, ge=1, le=32, description="shortest n-gram matched (ngram, suffix)")
    suffix_decoding_max_tree_depth: int = Field(
        24, ge=2, le=256, description="suffix: longest context + continuation kept per position"
    )
    suffix_decoding_max_cached_requests: int = Field(
        256, ge=0, le=100_000, description="suffix: finished requests whose outputs stay indexed"
    )
    suffix_decoding_min_token_prob: float = Field(
        0.1, ge=0.0, le=1.0, description="suffix: a continuation seen less often than this stops the proposal"
    )
    model: str | None = Field(None, description="draft_model: checkpoint folder (same tokenizer)")
    disable_by_batch_size: int | None = Field(
        None, ge=1, description="no proposals in a step with at least this many decodes"
    )
    max_step_rows: int = Field(
        16,
        ge=1,
        le=4096,
        description="proposals fill a step only up to this many decode rows (requests + proposals)",
    )
    row_cost: float | None = Field(
        0.2,
        ge=0.0,
        le=10.0,
        description="what one more decode row adds to a one-row step's time, as a fraction of it: a proposal is "
        "made only where its expected gain beats its cost at the step's batch size (ops/microbench/spec_rows.py "
        "measures it: 0.1-0.4 on the bundled Q4_1 model on 2 Zen 3 cores, by activation mode). null: learned "
        "from the worker's step times, starting at 0.2 (experimental: noisy machines move it)",
    )
    adaptive: bool = Field(True, description="each request's proposal length follows its acceptance")

    @model_validator(mode="before")
    @classmethod
    def _draft_model_by_default(cls, data: Any) -> Any:
        # vLLM: a `model` without a `method` means a draft model.
        if isinstance(data, dict) and data.get("model") and "method" not in data:
            return {**data, "method": "draft_model"}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed prompt_lookup_max "
                f"({self.prompt_lookup_max})"
            )
        if self.method == "draft_model" and not self.model:
            raise ValueError("method draft_model needs `model`: the draft checkpoint (same tokenizer)")
        if self.method != "draft_model" and self.model:
            raise ValueError(f"`model` is the draft checkpoint of method draft_model, not of {self.method}")
        return self


def parse_speculative_config(value: Any) -> Any:
    """A flag or environment value is JSON text; anything else goes to pydantic as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative_config must be a JSON object: {exc}") from None
    return value
