"""Pooling requests (SamplingParams.pooling) on the in-process engine against transformers.

A tiny random Qwen3 in Qwen3-Embedding form (float32): each pooled vector must be transformers' final
hidden states pooled the same way (cosine >= 0.9999), however the prefill is cut (chunks, a prefix-cache
hit, a batch of many), and the request must end without a sampled token and give every block back.
"""

from __future__ import annotations

import pytest
import torch
from harness.pooling_models import cosine, make_tiny_embedding_model, make_tiny_reranker, reference_embeddings
from pydantic import ValidationError

from pagedserve import LLM, SamplingParams
from pagedserve.shared.protocol.pooling import PoolingParams

TEXTS = ["hello", "a somewhat longer sentence about paged attention and pooling", "x" * 70, "yes or no"]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> str:
    return str(make_tiny_embedding_model(tmp_path_factory.mktemp("pool") / "tiny-embedding"))


@pytest.fixture(scope="module")
def llm(embedder) -> LLM:
    return LLM(embedder, num_blocks=128, block_size=8, max_num_batched_tokens=32)


def assert_close_vectors(got: list[list[float]], want: list[list[float]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert len(g) == len(w)
        assert cosine(g, w) >= 0.9999
        torch.testing.assert_close(torch.tensor(g), torch.tensor(w), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pooling", ["last", "mean", "cls"])
def test_pooled_vectors_equal_transformers_hidden_states_pooled_the_same_way(llm, embedder, pooling):
    got = llm.embed(TEXTS, PoolingParams(pooling=pooling, normalize=True))
    assert_close_vectors(got, reference_embeddings(embedder, TEXTS, pooling))
    assert llm.block_manager.num_free_blocks("worker-0") == llm.runner.num_blocks  # no KV kept


def test_unnormalised_and_cut_vectors(llm, embedder):
    raw = reference_embeddings(embedder, TEXTS, "mean", normalize=False)
    assert_close_vectors(llm.embed(TEXTS, PoolingParams(pooling="mean")), raw)
    cut = llm.embed(TEXTS, PoolingParams(pooling="last", dimensions=16, normalize=True))
    full = reference_embeddings(embedder, TEXTS, "last", normalize=False)
    want = [torch.nn.functional.normalize(torch.tensor(v[:16]), dim=0).tolist() for v in full]
    assert_close_vectors(cut, want)


def test_a_repeated_prompt_hits_the_prefix_cache_and_pools_the_same(llm, embedder):
    prompt = llm.encode(TEXTS[2])
    first = llm.generate([prompt], SamplingParams(max_tokens=1, pooling=PoolingParams()))[0]
    again = llm.generate([prompt], SamplingParams(max_tokens=1, pooling=PoolingParams()))[0]
    assert again.num_cached_tokens >= 8  # `last` reads only the last position: the cache may serve the rest
    torch.testing.assert_close(torch.tensor(again.vector), torch.tensor(first.vector), atol=1e-5, rtol=0)
    mean_again = llm.generate([prompt], SamplingParams(max_tokens=1, pooling=PoolingParams(pooling="mean")))[
        0
    ]
    assert mean_again.num_cached_tokens == 0  # mean reads every position: computed whole
    want = reference_embeddings(embedder, [TEXTS[2]], "mean", normalize=False)
    assert_close_vectors([mean_again.vector], want)


def test_a_pooling_request_samples_no_token(llm):
    out = llm.generate([llm.encode("hello")], SamplingParams(max_tokens=1, pooling=PoolingParams()))[0]
    assert out.token_ids == [] and out.finish_reason == "stop" and out.error is None


def test_pooling_mixed_with_generation_in_one_batch(llm, embedder):
    prompts = [llm.encode(t) for t in TEXTS]
    params = [
        SamplingParams(max_tokens=1, pooling=PoolingParams(normalize=True))
        if i % 2
        else SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
        for i in range(len(prompts))
    ]
    outs = llm.generate(prompts, params)
    assert [len(o.token_ids) for o in outs] == [5, 0, 5, 0]
    want = reference_embeddings(embedder, [TEXTS[1], TEXTS[3]], "last")
    assert_close_vectors([outs[1].vector, outs[3].vector], want)


def test_a_prompt_may_fill_the_context(tmp_path):
    folder = make_tiny_embedding_model(tmp_path / "e")
    small = LLM(str(folder), num_blocks=64, block_size=8, max_model_len=24)
    (vector,) = small.embed([list(range(3, 27))])  # 24 tokens: no room would be left to generate
    assert len(vector) == 64


def test_token_logits_equal_transformers_logits_at_the_last_position(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = make_tiny_reranker(tmp_path / "r")
    llm = LLM(str(folder), num_blocks=64, block_size=8)
    prompt = llm.encode("is this relevant? yes")
    (got,) = llm.embed([prompt], PoolingParams(token_ids=[5, 100, 7]))
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor([prompt])).logits[0, -1, [5, 100, 7]]
    torch.testing.assert_close(torch.tensor(got), want, atol=1e-4, rtol=0)


def test_pooling_refuses_what_only_a_sampled_token_has():
    for bad in ({"n": 2}, {"logprobs": 1}, {"prompt_logprobs": 0}):
        with pytest.raises(ValidationError, match="pooling samples no token"):
            SamplingParams(pooling=PoolingParams(), **bad)
    with pytest.raises(ValidationError, match="token_ids reads logits"):
        PoolingParams(token_ids=[1], pooling="mean")
