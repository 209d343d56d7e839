"""A prefill-only request: its prompt's hidden states pooled into one vector, no token sampled.

`SamplingParams.pooling` makes a request one of these (embeddings, scores): the worker computes the
prompt, and where a generation request would sample its first token it sends the pooled vector
instead (`PooledOutput`, in StepResult); the scheduler finishes the request with it (`Finished.pooled`).
Its blocks are freed like any finished request's: full blocks stay in the prefix cache as free,
evictable blocks (a repeated text computes only its last token), nothing else is kept.

Two outputs:
- an embedding: the final (normalised) hidden states pooled `last` (the last token's), `mean` (over the
  prompt) or `cls` (the first token's), optionally cut to `dimensions` (Matryoshka) and L2-normalised;
- `token_ids`: the raw logits of these tokens at the last position (a cross-encoder reading its answer
  from "yes"/"no" logits, as Qwen3-Reranker does).
The vector travels as little-endian float32 bytes (`pack_floats` / `unpack_floats`).
"""

from __future__ import annotations

import sys
from array import array
from typing import Annotated, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_DIMENSIONS = 1 << 16
MAX_SCORED_TOKENS = 64

PoolingKind = Literal["last", "mean", "cls"]


class PoolingParams(BaseModel):
    """What to pool. `mean` and `cls` read every prompt position, so such a request takes no
    prefix-cache hits (a cached position was never computed here); `last` and `token_ids` do."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pooling: PoolingKind = "last"
    normalize: bool = False
    dimensions: int | None = Field(
        default=None, ge=1, le=MAX_DIMENSIONS, description="keep the first N values"
    )
    token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SCORED_TOKENS,
        description="logits of these at the last position",
    )

    @model_validator(mode="after")
    def _one_output(self) -> PoolingParams:
        if self.token_ids is not None and (self.pooling != "last" or self.normalize or self.dimensions):
            raise ValueError(
                "token_ids reads logits at the last position: no pooling, normalize or dimensions"
            )
        return self

    @property
    def whole_prompt(self) -> bool:
        """Must every prompt position be computed here (no prefix-cache hits)?"""
        return self.token_ids is None and self.pooling != "last"


class PoolingSpec(msgspec.Struct, array_like=True, frozen=True):
    """The worker's copy of a request's PoolingParams (in WorkerSampling)."""

    pooling: str
    normalize: bool
    dimensions: int | None
    token_ids: list[int] | None

    @classmethod
    def of(cls, params: PoolingParams) -> PoolingSpec:
        return cls(params.pooling, params.normalize, params.dimensions, params.token_ids)


class PooledOutput(msgspec.Struct, array_like=True):
    """Worker -> scheduler: a pooling request's vector, in place of a sampled token (it ends there)."""

    request_id: str
    data: bytes  # float32, little-endian


def pack_floats(values: list[float]) -> bytes:
    packed = array("f", values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack_floats(data: bytes) -> list[float]:
    values = array("f", data)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()
