"""Request bodies of the pooling endpoints: OpenAI's /v1/embeddings, vLLM's /v1/score, and the
/v1/rerank that vLLM, Jina and Cohere share. A trust boundary, like schemas.py."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from pagedserve.services.api.schemas import TokenIds

MAX_INPUTS = 2048  # OpenAI's limit on one embeddings request's inputs
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EmbeddingRequest(_Body):
    model: ModelName
    input: str | list[str] | TokenIds | list[TokenIds]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = Field(None, max_length=256)
    # vLLM's extras
    normalize: bool | None = None
    priority: int | None = None


class RerankDocument(_Body):
    text: str


class RerankRequest(_Body):
    """vLLM's and Jina's shape; Cohere's v2 fields are the same ones (`max_tokens_per_doc` aside)."""

    model: ModelName
    query: str = Field(min_length=1)
    documents: list[str | RerankDocument] = Field(min_length=1, max_length=MAX_INPUTS)
    top_n: int | None = Field(None, ge=0)
    return_documents: bool = True
    instruction: str | None = None  # Qwen3-Reranker's <Instruct>
    user: str | None = Field(None, max_length=256)
    priority: int | None = None


class ScoreRequest(_Body):
    """vLLM's: `text_1` against each of `text_2` (one to many), or pairwise (two lists of one length)."""

    model: ModelName
    text_1: str | list[str]
    text_2: str | list[str]
    instruction: str | None = None
    user: str | None = Field(None, max_length=256)
    priority: int | None = None
