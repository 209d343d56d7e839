"""The load of `pagedserve chaos`: a fixed number of lanes, each streaming one request after another.

Every request ends up in exactly one bucket: finished, errored (by the code of its RequestError),
or lost (neither, when the drain deadline comes). Prompts are text (random common words, random
length), so the load fits any model with a tokenizer; decoding is greedy with EOS ignored, so a
finished request has exactly `max_tokens` tokens and a fault always lands in the middle of decodes.

Each request streams: its deltas, concatenated, must equal its final tokens and text (a duplicated
or missing token across a recompute or a reconnect shows up there). After the run the same prompts
go once more through the quiet deployment (`run_reference`): every finished output must equal it.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Prompts are drawn from these words: plain English that every tokenizer handles.
VOCABULARY = (
    "the quick brown fox jumps over a lazy dog while seven small birds sing about rivers "
    "mountains clouds bread coffee engines paper lamps windows gardens music numbers stones "
    "history science stories letters bridges trains silver winter summer ocean forest city"
)
WORDS = VOCABULARY.split()


@dataclass(frozen=True, slots=True)
class LoadSettings:
    endpoint: str
    duration_s: float = 60.0
    concurrency: int = 16
    min_prompt_words: int = 4
    max_prompt_words: int = 48
    max_tokens: int = 48
    drain_timeout_s: float = 120.0  # after the duration: how long unfinished requests may still take
    seed: int = 0
    api_url: str | None = None  # the OpenAI-compatible API's base URL (.../v1), when it runs
    api_lanes: int = 0  # how many of the lanes send their requests through that API
    # Asked at the drain deadline, when requests are lost: the scheduler's live requests by id (None from
    # it: the scheduler did not answer; None here: not asked).
    scheduler_view: Callable[[], dict[str, dict[str, Any]] | None] | None = None


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    prompt: str
    started: float
    ended: float | None = None
    error: str | None = None  # the RequestError code
    streamed_tokens: list[int] = field(default_factory=list)
    streamed_text: str = ""
    final_tokens: list[int] | None = None  # SDK requests; an API request has text only
    final_text: str | None = None  # set once the request finished
    via: str = "sdk"  # or "api": through the OpenAI-compatible HTTP API
    # API requests: time.monotonic() of each connection broken by the API server's death (then re-sent)
    interrupted_at: list[float] = field(default_factory=list)

    def stream_errors(self) -> tuple[int, int]:
        """(duplicated, missing) stream tokens against the final result: (0, 0) when they agree.
        An API stream is its own result (text only): the reference judges it."""
        if self.final_tokens is None or self.streamed_tokens == self.final_tokens:
            return 0, 0
        got, want = collections.Counter(self.streamed_tokens), collections.Counter(self.final_tokens)
        duplicated = sum((got - want).values())
        missing = sum((want - got).values())
        # The same tokens in another order is still a broken stream: count it as both.
        return (duplicated, missing) if duplicated or missing else (1, 1)


@dataclass(slots=True)
class LoadOutcome:
    sent: int = 0
    finished: int = 0
    errored: collections.Counter[str] = field(default_factory=collections.Counter)
    lost_ids: list[str] = field(default_factory=list)
    # Per lost request: what the client saw and the scheduler's record at the deadline (None: it had
    # none: the request never reached it or was dropped), for the hunt the verdict starts.
    lost_detail: list[dict[str, Any]] = field(default_factory=list)
    finish_reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    completion_tokens: int = 0
    wall_s: float = 0.0  # from the first submit until the last request ended (or was given up)
    records: list[RequestRecord] = field(default_factory=list)
    live: set[str] = field(default_factory=set)  # read by the watch thread for the timeline

    @property
    def lost(self) -> int:
        return len(self.lost_ids)

    def to_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "finished": self.finished,
            "errored": dict(self.errored),
            "errored_total": sum(self.errored.values()),
            "lost": self.lost,
            "lost_ids": self.lost_ids,
            "lost_detail": self.lost_detail,
            "finish_reasons": dict(self.finish_reasons),
            "completion_tokens": self.completion_tokens,
            "wall_s": round(self.wall_s, 3),
            "tokens_per_s": round(self.completion_tokens / self.wall_s, 1) if self.wall_s else 0.0,
            "via_api": sum(r.via == "api" for r in self.records),
            "api_interrupted": sum(len(r.interrupted_at) for r in self.records),
        }


def describe_lost(outcome: LoadOutcome, settings: LoadSettings) -> list[dict[str, Any]]:
    scheduler = settings.scheduler_view() if settings.scheduler_view else None
    now = time.monotonic()
    by_id = {r.request_id: r for r in outcome.records}
    details = []
    for rid in outcome.lost_ids:
        record = by_id[rid]
        detail: dict[str, Any] = {
            "request_id": rid,
            "via": record.via,
            "age_s": round(now - record.started, 3),
            "streamed_tokens": len(record.streamed_tokens),
            "api_interruptions": len(record.interrupted_at),
        }
        if record.via == "sdk":  # the API names its own requests to the scheduler
            detail["scheduler_answered"] = scheduler is not None
            detail["scheduler"] = None if scheduler is None else scheduler.get(rid)
        details.append(detail)
    return details


def make_prompt(rng: random.Random, settings: LoadSettings) -> str:
    n = rng.randint(settings.min_prompt_words, settings.max_prompt_words)
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def run_load(settings: LoadSettings, outcome: LoadOutcome | None = None) -> LoadOutcome:
    """Send requests for `duration_s`, then wait up to `drain_timeout_s` for the ones still live."""
    from pagedserve.shared.sdk import AsyncClient, RequestError

    outcome = outcome or LoadOutcome()
    rng = random.Random(settings.seed)
    run = uuid.uuid4().hex[:6]  # request ids unique across runs: a finished id would be answered from store
    live = outcome.live
    started = time.monotonic()
    stop_sending = started + settings.duration_s
    # The SDK must not time a request out before our own deadline: that would turn lost into "timeout".
    request_timeout_s = settings.duration_s + settings.drain_timeout_s + 30.0

    import httpx

    from pagedserve.ops.chaos.api_lane import RETRY_PAUSE_S, served_model, stream_completion

    deadline = stop_sending + settings.drain_timeout_s
    async with (
        AsyncClient(settings.endpoint, timeout_s=request_timeout_s) as client,
        httpx.AsyncClient(timeout=httpx.Timeout(request_timeout_s, connect=5.0)) as http,
    ):
        model = None
        if settings.api_url and settings.api_lanes:
            model = await served_model(http, settings.api_url, time.monotonic() + 120)

        async def one_via_api(request_id: str) -> None:
            outcome.sent += 1
            live.add(request_id)
            record = RequestRecord(request_id, make_prompt(rng, settings), time.monotonic(), via="api")
            outcome.records.append(record)
            body = {
                "model": model,
                "prompt": record.prompt,
                "max_tokens": settings.max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "stream": True,
                "user": request_id,
            }
            text: list[str] = []
            while True:
                text.clear()
                try:
                    finish, error = await stream_completion(http, settings.api_url, body, text.append)
                    break
                except httpx.TransportError as exc:
                    # The API server died under this request (or is not back yet: connection
                    # refused, not counted): a client retries on a new connection.
                    if not isinstance(exc, httpx.ConnectError):
                        record.interrupted_at.append(time.monotonic())
                    if time.monotonic() >= deadline:
                        finish, error = None, "api_unreachable"
                        break
                    await asyncio.sleep(RETRY_PAUSE_S)
            record.streamed_text = "".join(text)
            if error is not None:
                outcome.errored[error] += 1
                record.error = error
            else:
                record.final_text = record.streamed_text
                outcome.finished += 1
                outcome.finish_reasons[str(finish)] += 1
                outcome.completion_tokens += settings.max_tokens  # greedy, EOS ignored: all of them
            record.ended = time.monotonic()
            live.discard(request_id)

        async def one(request_id: str) -> None:
            outcome.sent += 1
            live.add(request_id)
            record = RequestRecord(request_id, make_prompt(rng, settings), time.monotonic())
            outcome.records.append(record)
            try:
                stream = client.stream(
                    record.prompt,
                    request_id=request_id,
                    max_tokens=settings.max_tokens,
                    temperature=0.0,
                    ignore_eos=True,
                )
                async for delta in stream:
                    record.streamed_tokens += delta.token_ids
                    record.streamed_text += delta.text
            except RequestError as e:
                outcome.errored[e.code] += 1
                record.error = e.code
            else:
                result = stream.result
                assert result is not None  # a stream that ends without error ends with its result
                record.final_tokens, record.final_text = list(result.token_ids), result.text
                outcome.finished += 1
                outcome.finish_reasons[result.finish_reason] += 1
                outcome.completion_tokens += len(result.token_ids)
            record.ended = time.monotonic()
            live.discard(request_id)

        async def lane(index: int) -> None:
            via_api = model is not None and index < settings.api_lanes
            n = 0
            while time.monotonic() < stop_sending:
                if via_api:
                    await one_via_api(f"chaos-{run}-api{index}-{n}")
                else:
                    await one(f"chaos-{run}-{index}-{n}")
                n += 1

        lanes = [asyncio.create_task(lane(i)) for i in range(settings.concurrency)]
        _, still_running = await asyncio.wait(lanes, timeout=max(deadline - time.monotonic(), 0.0))
        # Whatever is live now was neither finished nor refused: lost. Cancelling aborts it, so the
        # scheduler is asked about them first.
        outcome.lost_ids = sorted(live)
        if outcome.lost_ids:
            outcome.lost_detail = describe_lost(outcome, settings)
        for task in still_running:
            task.cancel()
        await asyncio.gather(*still_running, return_exceptions=True)
    outcome.wall_s = time.monotonic() - started
    return outcome


async def run_reference(
    endpoint: str, prompts: list[str], concurrency: int, max_tokens: int, timeout_s: float = 600.0
) -> list[tuple[list[int], str] | None]:
    """The fault-free outputs (tokens, text) of `prompts` (greedy, EOS ignored), `concurrency` at a
    time; None for a prompt whose reference itself failed."""
    from pagedserve.shared.sdk import AsyncClient, RequestError

    run = uuid.uuid4().hex[:6]
    out: list[tuple[list[int], str] | None] = [None] * len(prompts)
    gate = asyncio.Semaphore(concurrency)
    async with AsyncClient(endpoint, timeout_s=timeout_s) as client:

        async def one(i: int) -> None:
            async with gate:
                try:
                    result = await client.generate(
                        prompts[i],
                        request_id=f"chaos-ref-{run}-{i}",
                        max_tokens=max_tokens,
                        temperature=0.0,
                        ignore_eos=True,
                    )
                except RequestError:
                    return
                out[i] = (list(result.token_ids), result.text)

        await asyncio.gather(*(one(i) for i in range(len(prompts))))
    return out
