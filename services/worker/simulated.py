"""A runner that runs no model: each step sleeps a fixed time and returns deterministic fake tokens.

Same interface as `ModelRunner` (execute(Execute) -> StepResult, the pool it reports, `requests`),
so the worker service registers it, heartbeats and steps exactly as a real worker does. With it one
scheduler and block manager can drive dozens of workers on one machine (`pagedserve bench fleet`):
what is measured is the control plane, not the model.

The token after `tokens` is a function of the request's last token and its length only, so a
recompute (preemption, a lost worker) reproduces the same output, as greedy decoding would.
Token ids below `FIRST_TOKEN` (the tiny models' specials, EOS among them) are never produced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pagedserve.services.checkpoint import read_checkpoint
from pagedserve.shared.protocol.pooling import PooledOutput, pack_floats
from pagedserve.shared.protocol.step import Execute, StepResult

FIRST_TOKEN = 3


@dataclass(slots=True)
class SimulatedRequest:
    token_ids: list[int]  # prompt, then outputs
    num_computed_tokens: int
    num_blocks: int
    pools: bool = False  # sampling.pooling: a fake vector at the prompt's end instead of a token


def fake_token(last: int, length: int, vocab_size: int) -> int:
    return FIRST_TOKEN + (last * 1103515245 + length * 12345) % (vocab_size - FIRST_TOKEN)


class SimulatedRunner:
    def __init__(
        self,
        model_path: str | Path | None,
        *,
        step_ms: float,
        block_size: int = 16,
        num_blocks: int | None = None,
    ) -> None:
        self.step_s = step_ms / 1000.0
        self.block_size = block_size
        self.num_blocks = num_blocks or 4096
        # Without a checkpoint: a Llama-sized vocabulary and context, and no EOS to avoid.
        self.vocab_size = 32000
        self.max_model_len = 2048
        self.eos_token_ids: list[int] = []
        path = Path(model_path) if model_path is not None else None
        if path is not None and (path.suffix == ".gguf" or (path / "config.json").exists()):
            checkpoint = read_checkpoint(path)
            self.vocab_size = checkpoint.vocab_size
            self.max_model_len = checkpoint.max_model_len
            self.eos_token_ids = list(checkpoint.eos_token_ids)
        self.attention_backend = "simulated"
        self.runtime = {"runner": "simulated", "step_ms": f"{step_ms:g}"}
        self.requests: dict[str, SimulatedRequest] = {}

    def execute(self, step: Execute) -> StepResult:
        started = time.perf_counter()
        for request_id in step.finished_ids:
            self.requests.pop(request_id, None)
        scheduled: list[tuple[str, SimulatedRequest, int]] = []
        for new in step.new_requests:
            self._check_blocks(new.request_id, new.block_ids)
            state = SimulatedRequest(
                list(new.token_ids),
                new.num_computed_tokens,
                len(new.block_ids),
                new.sampling.pooling is not None,
            )
            self.requests[new.request_id] = state
            if new.num_scheduled_tokens:
                scheduled.append((new.request_id, state, new.num_scheduled_tokens))
        for cached in step.cached_requests:
            state = self.requests.get(cached.request_id)
            if state is None:
                raise KeyError(
                    f"step {step.step} names request {cached.request_id!r}, which this worker does not hold"
                )
            self._check_blocks(cached.request_id, cached.new_block_ids)
            state.num_blocks += len(cached.new_block_ids)
            if cached.num_scheduled_tokens:
                scheduled.append((cached.request_id, state, cached.num_scheduled_tokens))
        ids: list[str] = []
        tokens: list[int] = []
        pooled: list[PooledOutput] = []
        for request_id, state, n in scheduled:
            state.num_computed_tokens += n
            if state.pools and state.num_computed_tokens >= len(state.token_ids):
                fake = [fake_token(t, i, 1000) / 1000.0 for i, t in enumerate(state.token_ids[-8:])]
                pooled.append(PooledOutput(request_id, pack_floats(fake)))
            elif state.num_computed_tokens >= len(state.token_ids):  # reached its end: one new token
                token = fake_token(state.token_ids[-1], len(state.token_ids), self.vocab_size)
                state.token_ids.append(token)
                ids.append(request_id)
                tokens.append(token)
        for fork in step.forks:  # n > 1: the child starts as a copy, with its own next token
            parent = self.requests[fork.parent_id]
            child = SimulatedRequest(parent.token_ids[:-1], parent.num_computed_tokens, parent.num_blocks)
            token = fake_token(
                child.token_ids[-1] + (fork.seed or 0) + 1, len(child.token_ids), self.vocab_size
            )
            child.token_ids.append(token)
            self.requests[fork.child_id] = child
            ids.append(fork.child_id)
            tokens.append(token)
        # The model's time: sleep the rest of the step (a real step's cost does not depend on us).
        remaining = self.step_s - (time.perf_counter() - started)
        if remaining > 0 and scheduled:
            time.sleep(remaining)
        timings = {"step_s": time.perf_counter() - started}
        return StepResult(step.step, ids, tokens, None, timings, pooled=pooled)

    def _check_blocks(self, owner: str, block_ids: list[int]) -> None:
        if block_ids and (min(block_ids) < 0 or max(block_ids) >= self.num_blocks):
            raise ValueError(f"{owner!r}: block ids must be in [0, {self.num_blocks}); got {block_ids}")
