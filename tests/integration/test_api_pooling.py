"""/v1/embeddings, /v1/score and /v1/rerank over raw HTTP, against real processes, checked against
transformers: the shared deployment of a tiny Qwen3-Reranker-form model, with two API processes in
front of it, one serving it as an embedding model (`--runner embed --pooling mean`), one as a reranker."""

from __future__ import annotations

import base64
import struct

import httpx
import pytest
from harness.api_server import ApiServer
from harness.pooling_models import cosine, reference_embeddings, reference_rerank_scores
from transformers import AutoTokenizer

from pagedserve.services.api.rerank_template import judge_prompt

QUERY = "what is paged attention?"
DOCS = ["a block table maps tokens to blocks", "yes", "no idea", "paged attention keeps KV in blocks"]


@pytest.fixture(scope="module")
def servers(word_model_deployment):
    dep = word_model_deployment
    embed = ApiServer(dep.sup.config, dep.log_dir / "api-embed.log", "--runner", "embed", "--pooling", "mean")
    rerank = ApiServer(dep.sup.config, dep.log_dir / "api-rerank.log", "--runner", "rerank")
    try:
        embed.wait_healthy()
        rerank.wait_healthy()
        yield dep.model_path, embed, rerank, dep.sup
    finally:
        embed.stop()
        rerank.stop()


def post(server: ApiServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base}{path}", json={"model": "tiny-reranker", **body}, timeout=60)


def test_embeddings_of_strings_and_token_arrays_equal_transformers_mean_pooling(servers):
    folder, embed, _, _ = servers
    texts = ["hello world", "x" * 100, "yes"]
    reply = post(embed, "/v1/embeddings", {"input": texts})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    want = reference_embeddings(folder, texts, "mean")
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    for item, expected in zip(body["data"], want, strict=True):
        assert item["object"] == "embedding" and cosine(item["embedding"], expected) >= 0.9999
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("hello world")["input_ids"]
    assert body["usage"]["prompt_tokens"] == sum(len(tokenizer(t)["input_ids"]) for t in texts)
    by_ids = post(embed, "/v1/embeddings", {"input": ids, "encoding_format": "base64"}).json()
    raw = base64.b64decode(by_ids["data"][0]["embedding"])
    vector = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert cosine(vector, want[0]) >= 0.9999


def test_dimensions_cut_and_renormalise(servers):
    folder, embed, _, _ = servers
    body = post(embed, "/v1/embeddings", {"input": "hello world", "dimensions": 8}).json()
    vector = body["data"][0]["embedding"]
    assert len(vector) == 8 and abs(sum(x * x for x in vector) - 1.0) < 1e-5
    full = reference_embeddings(folder, ["hello world"], "mean", normalize=False)[0]
    assert cosine(vector, full[:8]) >= 0.9999


def test_rerank_scores_equal_the_yes_share_of_transformers_logits(servers):
    folder, _, rerank, _ = servers
    reply = post(rerank, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 3})
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    want = reference_rerank_scores(folder, [judge_prompt(tokenizer, QUERY, d, None, 512) for d in DOCS])
    assert len(results) == 3
    assert [r["index"] for r in results] == sorted(range(4), key=lambda i: -want[i])[:3]
    for r in results:
        assert abs(r["relevance_score"] - want[r["index"]]) <= 1e-4
        assert r["document"]["text"] == DOCS[r["index"]]
    # Cohere's document objects and /v2 path give the same scores
    v2 = post(rerank, "/v2/rerank", {"query": QUERY, "documents": [{"text": d} for d in DOCS]}).json()
    assert {r["index"]: r["relevance_score"] for r in v2["results"]} == pytest.approx(
        dict(enumerate(want)), abs=1e-4
    )


def test_score_pairs_one_to_many_and_pairwise(servers):
    folder, embed, rerank, _ = servers
    tokenizer = AutoTokenizer.from_pretrained(folder)
    body = post(rerank, "/v1/score", {"text_1": QUERY, "text_2": DOCS[:2]}).json()
    want = reference_rerank_scores(folder, [judge_prompt(tokenizer, QUERY, d, None, 512) for d in DOCS[:2]])
    assert [d["score"] for d in body["data"]] == pytest.approx(want, abs=1e-4)
    assert body["object"] == "list" and body["data"][0]["object"] == "score"
    # a bi-encoder: cosine of the two embeddings
    pairs = post(embed, "/score", {"text_1": ["hello", "no idea"], "text_2": ["yes", "no idea"]}).json()
    vectors = reference_embeddings(folder, ["hello", "yes", "no idea"], "mean")
    assert pairs["data"][0]["score"] == pytest.approx(cosine(vectors[0], vectors[1]), abs=1e-4)
    assert pairs["data"][1]["score"] == pytest.approx(1.0, abs=1e-4)


def test_each_server_refuses_what_it_is_not_served_as(servers):
    _, embed, rerank, _ = servers
    reply = post(rerank, "/v1/embeddings", {"input": "hi"})
    assert reply.status_code == 400 and "--runner embed" in reply.json()["error"]["message"]
    chat = post(embed, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "unsupported_by_model"
    bad = post(embed, "/v1/embeddings", {"input": "hi", "dimensions": 100000})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "dimensions"
    empty = post(embed, "/v1/embeddings", {"input": []})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "input"
    mismatch = post(rerank, "/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert mismatch.status_code == 400 and mismatch.json()["error"]["param"] == "text_2"


def test_pooling_routes_are_counted_in_metrics_and_leave_no_blocks(servers):
    _, embed, rerank, sup = servers
    metrics = httpx.get(f"{embed.base}/metrics").text
    assert 'route="/v1/embeddings"' in metrics
    assert 'route="/v1/rerank"' in httpx.get(f"{rerank.base}/metrics").text
    from harness.deployment import get_json

    health = get_json(f"{sup.block_manager_ops_url}/blocks")
    assert health["totals"]["leaked"] == 0
