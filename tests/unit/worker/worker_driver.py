"""A test-only stand-in for the scheduler and block manager, to drive a ModelRunner with real Execute messages.

Every unfinished request runs every step: its prompt in chunks of `chunk_size` (whole when None),
then one decode per step. Blocks come from a shuffled free list (so tables are not contiguous) and
go back when the request's finish is sent. With `depth` > 1 the runner executes on its own thread
and the driver sends up to `depth` steps before reading a result, as the real scheduler does: a
decode's input token is then one the driver has not seen yet, so only the runner can supply it.
Messages travel through msgpack, as on the wire.
"""

from __future__ import annotations

import queue
import random
import threading
from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.protocol.codec import decode
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.messages import encode_message, read_message
from pagedserve.shared.protocol.step import (
    CachedRequest,
    Execute,
    ExecuteMessage,
    NewRequest,
    StepResult,
    WorkerSampling,
)


def sampling(**fields: Any) -> WorkerSampling:
    """SamplingParams fields as the scheduler sends them to the worker."""
    return WorkerSampling.of(SamplingParams(**fields), fields.get("seed"))


GREEDY = sampling(temperature=0.0)


@dataclass(slots=True)
class _Request:
    request_id: str
    prompt: list[int]
    max_tokens: int
    sampling: WorkerSampling
    block_ids: list[int] = field(default_factory=list)
    num_scheduled: int = 0  # tokens whose computation has been sent
    samples_scheduled: int = 0  # steps sent that will sample a token for it
    outputs: list[int] = field(default_factory=list)
    sent: bool = False
    done: bool = False
    lora: tuple[str, str] | None = None  # (adapter name, path)


class StepDriver:
    def __init__(
        self,
        runner: ModelRunner,
        *,
        chunk_size: int | None = None,
        depth: int = 1,
        stop_token_ids: tuple[int, ...] = (),
        seed: int = 0,
    ) -> None:
        self.runner = runner
        self.chunk_size = chunk_size
        self.depth = depth
        self.stop_token_ids = set(stop_token_ids)
        self.free_blocks = list(range(runner.num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.step = 0
        self.results: list[StepResult] = []

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        sampling: WorkerSampling | None = None,
        loras: list[tuple[str, str] | None] | None = None,
    ) -> list[list[int]]:
        """Run every prompt to max_tokens (or a stop token) -> output tokens per prompt.
        loras: per prompt its LoRA adapter (name, path) or None for the base model."""
        loras = loras or [None] * len(prompts)
        requests = [
            _Request(f"req-{self.step}-{i}", list(p), max_tokens, sampling or GREEDY, lora=lora)
            for i, (p, lora) in enumerate(zip(prompts, loras, strict=True))
        ]
        by_id = {r.request_id: r for r in requests}
        to_finish: list[str] = []
        inbox: queue.Queue[Execute | None] = queue.Queue()
        outbox: queue.Queue[StepResult | BaseException] = queue.Queue()
        worker = threading.Thread(target=self._serve, args=(inbox, outbox), daemon=True)
        worker.start()
        in_flight = 0
        try:
            while not all(r.done for r in requests) or to_finish:
                while in_flight < self.depth:
                    step = self._next_step(requests, to_finish)
                    if step is None:
                        break
                    inbox.put(read_message(decode(encode_message(ExecuteMessage(step)))).execute)
                    in_flight += 1
                if in_flight == 0:
                    if any(not r.done for r in requests):
                        raise AssertionError("driver stalled: nothing to schedule and nothing in flight")
                    break
                result = outbox.get(timeout=120)
                in_flight -= 1
                if isinstance(result, BaseException):
                    raise result
                self.results.append(result)
                for request_id, token in zip(result.request_ids, result.token_ids, strict=True):
                    request = by_id[request_id]
                    if request.done:
                        continue  # sampled by a step sent before we knew it had stopped: dropped
                    request.outputs.append(token)
                    if token in self.stop_token_ids or len(request.outputs) == request.max_tokens:
                        request.done = True
                        to_finish.append(request_id)
            while in_flight:
                result = outbox.get(timeout=120)
                in_flight -= 1
                if isinstance(result, BaseException):
                    raise result
        finally:
            inbox.put(None)
            worker.join(timeout=120)
        return [r.outputs for r in requests]

    def _next_step(self, requests: list[_Request], to_finish: list[str]) -> Execute | None:
        step = Execute(self.step)
        # Freed the moment the finish is sent: the runner handles a step's finished_ids before
        # anything else in it, and runs steps in order, so no later step can read these blocks.
        for request_id in to_finish:
            request = next(r for r in requests if r.request_id == request_id)
            step.finished_ids.append(request_id)
            self.free_blocks += request.block_ids
            request.block_ids = []
        to_finish.clear()
        for request in requests:
            if request.done:
                continue
            remaining_prompt = len(request.prompt) - request.num_scheduled
            if remaining_prompt > 0:
                n = remaining_prompt if self.chunk_size is None else min(self.chunk_size, remaining_prompt)
                if n == remaining_prompt:
                    request.samples_scheduled += 1
            elif request.samples_scheduled < request.max_tokens:
                n = 1  # decode: its input is the token the previous step samples
                request.samples_scheduled += 1
            else:
                continue  # every token it needs is in flight
            new_blocks = self._allocate(request, request.num_scheduled + n)
            if not request.sent:
                step.new_requests.append(
                    NewRequest(
                        request.request_id,
                        request.prompt,
                        len(request.prompt),
                        0,
                        n,
                        list(request.block_ids),
                        request.sampling,
                        *(request.lora or (None, None)),
                    )
                )
                request.sent = True
            else:
                step.cached_requests.append(CachedRequest(request.request_id, n, new_blocks))
            request.num_scheduled += n
        if not step.finished_ids and not step.new_requests and not step.cached_requests:
            return None
        self.step += 1
        return step

    def _allocate(self, request: _Request, num_tokens: int) -> list[int]:
        block_size = self.runner.block_size
        needed = -(-num_tokens // block_size) - len(request.block_ids)
        if needed > len(self.free_blocks):
            raise AssertionError("test driver ran out of KV blocks: give the runner more")
        new = [self.free_blocks.pop() for _ in range(max(needed, 0))]
        request.block_ids += new
        return new

    def _serve(
        self, inbox: queue.Queue[Execute | None], outbox: queue.Queue[StepResult | BaseException]
    ) -> None:
        while (step := inbox.get()) is not None:
            try:
                outbox.put(self.runner.execute(step))
            except BaseException as exc:  # handed to the test thread, which raises it
                outbox.put(exc)
