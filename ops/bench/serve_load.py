"""The load of `pagedserve bench serve`: streamed completions over HTTP at a request rate.

Arrivals are a Poisson process (`rate` requests/s, exponential gaps from a seeded RNG; `inf` sends
everything at once), optionally capped at `max_concurrency` in flight. Each request is timed from
its send: the first content chunk (TTFT), every later one (inter-token latency), the last (E2E).
Any OpenAI-compatible server works: prompts go as token ids, `ignore_eos` keeps output lengths
exact (vLLM and pagedserve honour it), and the last chunk's usage counts the output tokens.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx


@dataclass(slots=True)
class RequestRecord:
    prompt_tokens: int
    max_tokens: int
    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first."""
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class LoadSpec:
    base_url: str
    model: str
    prompts: list[list[int]]
    output_lens: list[int]
    request_rate: float  # requests/s; math.inf = all at once
    max_concurrency: int | None = None
    seed: int = 0
    api_key: str | None = None
    timeout_s: float = 1800.0
    # For a server that takes only text (llama_cpp.server): each prompt as text, and body fields of its own.
    prompt_texts: list[str] | None = None
    extra_body: dict | None = None


def arrival_gaps(n: int, rate: float, seed: int) -> list[float]:
    """Seconds to wait before each request: exponential gaps (Poisson arrivals), or none for inf."""
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"request_rate must be > 0 or inf, got {rate}")
    rng = random.Random(seed)
    return [rng.expovariate(rate) for _ in range(n)]


async def _one(
    http: httpx.AsyncClient, spec: LoadSpec, prompt: list[int], max_tokens: int, text: str | None = None
) -> RequestRecord:
    record = RequestRecord(len(prompt), max_tokens)
    body = {
        "model": spec.model,
        "prompt": prompt if text is None else text,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(spec.extra_body or {}),
    }
    started = last = time.perf_counter()
    chunks = 0
    try:
        async with http.stream("POST", "/completions", json=body) as reply:
            if reply.status_code != 200:
                record.error = f"HTTP {reply.status_code}: {(await reply.aread()).decode()[:300]}"
                return record
            async for line in reply.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    record.error = str(chunk["error"])[:300]
                    return record
                if chunk.get("usage"):
                    record.output_tokens = chunk["usage"]["completion_tokens"]
                if any(c.get("text") for c in chunk.get("choices", [])):
                    now = time.perf_counter()
                    if record.ttft_s is None:
                        record.ttft_s = now - started
                    else:
                        record.itl_s.append(now - last)
                    last = now
                    chunks += 1
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return record
    record.e2e_s = time.perf_counter() - started
    record.output_tokens = record.output_tokens or chunks
    record.ok = record.ttft_s is not None
    if not record.ok:
        record.error = "no content chunk arrived"
    return record


async def run_load(
    spec: LoadSpec, on_done: Callable[[RequestRecord], None] | None = None
) -> tuple[list[RequestRecord], float]:
    """Send every request on schedule -> (records in send order, seconds from the first send to the last end)."""
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    gate = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else None
    async with httpx.AsyncClient(
        base_url=spec.base_url, headers=headers, timeout=spec.timeout_s, limits=limits
    ) as http:

        async def send(prompt: list[int], max_tokens: int, text: str | None) -> RequestRecord:
            if gate is None:
                record = await _one(http, spec, prompt, max_tokens, text)
            else:
                async with gate:
                    record = await _one(http, spec, prompt, max_tokens, text)
            if on_done is not None:
                on_done(record)
            return record

        tasks = []
        started = time.perf_counter()
        texts = spec.prompt_texts or [None] * len(spec.prompts)
        for gap, prompt, max_tokens, text in zip(
            arrival_gaps(len(spec.prompts), spec.request_rate, spec.seed),
            spec.prompts,
            spec.output_lens,
            texts,
            strict=True,
        ):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(send(prompt, max_tokens, text)))
        records = list(await asyncio.gather(*tasks))
        return records, time.perf_counter() - started
