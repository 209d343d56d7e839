"""Embedding throughput: pagedserve's /v1/embeddings against llama.cpp's `llama-server --embedding` on
the same GGUF, sequences per second at each concurrency.

    python -m pagedserve.ops.bench.embeddings [--model smollm2-135m] [--concurrency 1,16,64] \
        [--requests 128] [--tokens 128] [--threads 2] [--out bench/results/embeddings.json]

Both servers get the same texts (seeded: random words, cut to --tokens tokens by the model's
tokenizer), one text per request, `--concurrency` requests in flight at a time, and pool the
last token's final hidden state, L2-normalised (ours: `--runner embed --pooling last`; llama.cpp:
`--pooling last`, which normalises by default). Each concurrency sends `--requests` requests after a
warm-up of its own; every request draws a text of its own, so neither server's prompt cache helps.
The first few embeddings of both are compared (cosine) to show they compute the same thing.
llama-server comes from LLAMACPP_VENV (default .venv-llamacpp at the repo root; ops/peers/setup_llamacpp.sh).
Name the CPU and the load beside any number you quote.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from pagedserve.kernels.cpu.isa import cpu_model
from pagedserve.ops.bench.llamacpp_server import llama_server_binary, llamacpp_venv, running_server
from pagedserve.ops.deploy.local_api import free_ports, serving_api
from pagedserve.ops.results import write_json
from pagedserve.services.checkpoint import load_checkpoint, load_tokenizer
from pagedserve.shared.config import add_config_flag

WORDS = [
    "paged",
    "attention",
    "block",
    "table",
    "cache",
    "prefix",
    "scheduler",
    "worker",
    "token",
    "model",
    "vector",
    "search",
    "query",
    "document",
]


def make_texts(tokenizer: Any, count: int, tokens: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        words = " ".join(rng.choice(WORDS) + str(rng.randrange(1000)) for _ in range(tokens))
        ids = tokenizer.encode(words, add_special_tokens=False)[:tokens]
        texts.append(tokenizer.decode(ids))
    return texts


async def _load(url: str, model: str, texts: list[str], concurrency: int) -> tuple[float, list[list[float]]]:
    """Seconds to embed every text with `concurrency` in flight; the first vectors, for the check."""
    queue = list(enumerate(texts))
    vectors: dict[int, list[float]] = {}

    async def lane(http: httpx.AsyncClient) -> None:
        while queue:
            i, text = queue.pop(0)
            reply = await http.post(url, json={"model": model, "input": text}, timeout=600)
            reply.raise_for_status()
            if i < 4:
                vectors[i] = reply.json()["data"][0]["embedding"]

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(lane(http) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return elapsed, [vectors[i] for i in sorted(vectors)]


def measure(url: str, model: str, texts_of: Any, levels: list[int], requests: int) -> dict[str, Any]:
    runs, check = {}, None
    for n, concurrency in enumerate(levels):
        asyncio.run(_load(url, model, texts_of(1000 + n, max(concurrency, 4)), concurrency))  # warm-up
        elapsed, vectors = asyncio.run(_load(url, model, texts_of(n, requests), concurrency))
        runs[str(concurrency)] = {
            "seconds": round(elapsed, 3),
            "sequences_per_s": round(requests / elapsed, 2),
        }
        check = check or vectors
        print(f"  concurrency {concurrency}: {requests / elapsed:.2f} sequences/s", flush=True)
    return {"runs": runs, "first_vectors": check}


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def run_pagedserve(
    model: str, threads: int, texts_of: Any, levels: list[int], requests: int
) -> dict[str, Any]:
    with serving_api(model, num_threads=threads, runner="embed", pooling="last") as base:
        name = httpx.get(f"{base}/v1/models", timeout=5).json()["data"][0]["id"]
        print("pagedserve:", flush=True)
        return measure(f"{base}/v1/embeddings", name, texts_of, levels, requests)


def run_llamacpp(
    gguf: Path, threads: int, texts_of: Any, levels: list[int], requests: int, tokens: int
) -> dict[str, Any]:
    binary = llama_server_binary(llamacpp_venv())
    if binary is None:
        raise FileNotFoundError(
            f"no llama-server in {llamacpp_venv()} (ops/peers/setup_llamacpp.sh builds it)"
        )
    (port,) = free_ports(1)
    parallel = max(levels)
    slot = tokens + 64
    argv = [
        str(binary), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "--threads", str(threads), "--threads-batch", str(threads),
        "--embedding", "--pooling", "last",
        "--parallel", str(parallel), "--ctx-size", str(slot * parallel), "--no-kv-unified",
        "--batch-size", "2048", "--ubatch-size", "2048", "--cont-batching", "--no-webui",
    ]  # fmt: skip
    log = Path(tempfile.mkdtemp(prefix="llamacpp-embed-")) / "llama-server.log"
    base = f"http://127.0.0.1:{port}/v1"
    with running_server(argv, base, log):
        print("llama.cpp:", flush=True)
        return measure(f"{base}/embeddings", "model", texts_of, levels, requests)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flag(ap, "model")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--requests", type=int, default=128, help="requests per concurrency")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per text")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peers", default="pagedserve,llamacpp")
    ap.add_argument("--out", type=Path, default=Path("bench/results/embeddings.json"))
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",")]
    from pagedserve.services.worker.weights.gguf_weights import gguf_source

    checkpoint = load_checkpoint(args.model)
    gguf = gguf_source(checkpoint.path)
    tokenizer = load_tokenizer(checkpoint.tokenizer_path)

    def texts_of(round_: int, count: int) -> list[str]:
        return make_texts(tokenizer, count, args.tokens, args.seed * 100_000 + round_)

    results: dict[str, Any] = {}
    peers = args.peers.split(",")
    if "pagedserve" in peers:
        results["pagedserve"] = run_pagedserve(args.model, args.threads, texts_of, levels, args.requests)
    if "llamacpp" in peers:
        if gguf is None:
            raise SystemExit(f"{checkpoint.path} has no GGUF for llama.cpp to read")
        results["llamacpp"] = run_llamacpp(gguf, args.threads, texts_of, levels, args.requests, args.tokens)
    report: dict[str, Any] = {
        "benchmark": "embeddings",
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "model": args.model,
        "gguf": str(gguf),
        "settings": {k: getattr(args, k) for k in ("concurrency", "requests", "tokens", "threads", "seed")},
        "peers": {k: v["runs"] for k, v in results.items()},
    }
    if len(results) == 2:
        ours, theirs = results["pagedserve"], results["llamacpp"]
        report["ratio"] = {
            c: round(ours["runs"][c]["sequences_per_s"] / theirs["runs"][c]["sequences_per_s"], 3)
            for c in ours["runs"]
        }
        cosines = [
            _cosine(a, b) for a, b in zip(ours["first_vectors"], theirs["first_vectors"], strict=False)
        ]
        report["cosine_ours_vs_llamacpp"] = {"min": min(cosines), "median": statistics.median(cosines)}
    print({k: report[k] for k in ("peers", "ratio", "cosine_ours_vs_llamacpp") if k in report})
    write_json(args.out, report)


if __name__ == "__main__":
    main()
