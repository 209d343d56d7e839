"""The benchmark's workload and the KV accounting of static pre-allocation.

Modelled on nano-vllm's bench.py: N requests of random token ids, prompt and output lengths
uniform in [min_len, max_len], every request generating exactly its own output length (EOS
ignored). The same `Workload` goes through every path, so their numbers compare.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]
    seed: int

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    def summary(self) -> dict[str, int]:
        return {
            "num_requests": len(self),
            "seed": self.seed,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "longest_prompt": max(len(p) for p in self.prompts),
            "longest_output": max(self.output_lens),
        }


def make_workload(
    num_requests: int, vocab_size: int, *, seed: int = 0, min_len: int = 16, max_len: int = 256
) -> Workload:
    """Deterministic for a seed: its own RNG, so nothing else in the process shifts it."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(vocab_size) for _ in range(rng.randint(min_len, max_len))] for _ in range(num_requests)
    ]
    output_lens = [rng.randint(min_len, max_len) for _ in range(num_requests)]
    return Workload(prompts, output_lens, seed)


def static_batches(num_requests: int, batch_size: int) -> list[range]:
    """Requests in arrival order, cut into consecutive batches (the last one may be short)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return [range(i, min(i + batch_size, num_requests)) for i in range(0, num_requests, batch_size)]


@dataclass(frozen=True, slots=True)
class StaticBatchAccounting:
    """What a static batch of requests spends: it runs to its longest output and pads to its longest prompt."""

    own_output_tokens: int  # each request's own output length: the only tokens anyone asked for
    decoded_tokens: int  # rows x longest output: what the batch actually generates
    kv_utilization: float  # own prompt+output tokens / slots pre-allocated, averaged over batches


def static_batch_accounting(workload: Workload, batch_size: int) -> StaticBatchAccounting:
    own = decoded = 0
    utilizations: list[float] = []
    for batch in static_batches(len(workload), batch_size):
        prompt_lens = [len(workload.prompts[i]) for i in batch]
        output_lens = [workload.output_lens[i] for i in batch]
        own += sum(output_lens)
        decoded += len(batch) * max(output_lens)
        # A padded KV cache holds every row for longest prompt + longest output.
        slots = len(batch) * (max(prompt_lens) + max(output_lens))
        utilizations.append((sum(prompt_lens) + sum(output_lens)) / slots)
    return StaticBatchAccounting(own, decoded, sum(utilizations) / len(utilizations))


def max_len_utilization(workload: Workload, max_model_len: int) -> float:
    """KV utilisation when every request pre-allocates max_model_len slots (a contiguous cache)."""
    used = sum(len(p) + o for p, o in zip(workload.prompts, workload.output_lens, strict=True))
    return used / (len(workload) * max_model_len)
