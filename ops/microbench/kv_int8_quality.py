"""int8 KV against float32 KV on a prompt set: the numbers of the accuracy policy (docs/kv-int8.md).

    python -m pagedserve.ops.microbench.kv_int8_quality [--model smollm2-135m] [--prompts 24]
        [--forced-tokens 128] [--greedy-tokens 256] [--out bench/results/kv-int8-quality.json]

Two runners of the same model and weights, float32 KV and int8 KV, the prompts in one batch:
- teacher-forced: float32 KV decodes greedily; the int8 runner is fed the same tokens (its own
  samples replaced), and at every position the KL divergence KL(p_float32 || p_int8) of the
  next-token distributions and whether their argmax agrees;
- free-running: each decodes greedily on its own; per prompt, whether the outputs are identical and
  where they first differ.
`policy_check` holds the numbers to the written policy; tests/slow/test_kv_int8_quality.py runs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from pagedserve.services.checkpoint import load_tokenizer, resolve_model
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.config import add_config_flag
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest, WorkerSampling

BLOCK = 16
GREEDY = WorkerSampling.of(SamplingParams(temperature=0.0), None)

# The written policy (docs/kv-int8.md): what int8 KV must keep of float32 KV's behaviour.
POLICY = {
    "mean_kl_max": 2e-3,  # nats, over every teacher-forced position
    "p99_kl_max": 2e-2,
    "top1_agreement_min": 0.98,
    "greedy_median_first_divergence_min": 64,  # tokens; identical outputs count as the full length
}

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "Explain how a bicycle stays upright.",
    "List three uses of copper.",
    "What is the difference between weather and climate?",
    "Once upon a time, in a small village by the mountains,",
    "def fibonacci(n):",
    "Translate to French: The cat sleeps on the warm windowsill.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "The three laws of thermodynamics are",
    "Summarize the plot of Romeo and Juliet.",
    "How do vaccines train the immune system?",
    "Describe the water cycle for a child.",
    "What are prime numbers? Give examples.",
    "The history of the printing press begins",
    "Write an email asking for a meeting next week.",
    "What does a compiler do?",
    "Name the planets of the solar system in order.",
    "In economics, inflation means",
    "Tell me a joke about computers.",
    "How does a refrigerator keep food cold?",
    "The best way to learn a new language is",
    "Explain photosynthesis in two sentences.",
    "A train leaves the station at 3 pm travelling at 60 km/h.",
    "What is the Pythagorean theorem?",
    "Write a haiku about autumn leaves.",
    "The main causes of the First World War were",
    "How do bees make honey?",
    "Describe a sunset over the desert.",
    "What is machine learning?",
    "import numpy as np\n# compute the mean of a list\n",
]


class Batch:
    """Every prompt as one request of one runner, driven step by step."""

    def __init__(self, runner: ModelRunner, prompts: list[list[int]], budget: int) -> None:
        self.runner = runner
        self.prompts = prompts
        per_request = -(-budget // BLOCK)
        self.tables = [list(range(i * per_request, (i + 1) * per_request)) for i in range(len(prompts))]
        self.step = 0

    def run(self, execute: Execute) -> torch.Tensor:
        execute.step = self.step
        self.step += 1
        _result, logits = self.runner.execute_with_logits(execute)
        assert logits is not None
        return logits.float()

    def prefill(self) -> torch.Tensor:
        return self.run(
            Execute(
                0,
                new_requests=[
                    NewRequest(f"r{i}", p, len(p), 0, len(p), self.tables[i], GREEDY)
                    for i, p in enumerate(self.prompts)
                ],
            )
        )

    def decode(self, forced: list[int] | None = None) -> torch.Tensor:
        if forced is not None:  # teacher forcing: the next input is this token, not our own sample
            for i, token in enumerate(forced):
                self.runner.requests[f"r{i}"].output_token_ids[-1] = token
        return self.run(
            Execute(0, cached_requests=[CachedRequest(f"r{i}", 1) for i in range(len(self.prompts))])
        )

    def outputs(self) -> list[list[int]]:
        return [list(self.runner.requests[f"r{i}"].output_token_ids) for i in range(len(self.prompts))]


def evaluate(model: str, num_prompts: int, forced_tokens: int, greedy_tokens: int) -> dict[str, Any]:
    path = resolve_model(model)
    tokenizer = load_tokenizer(path)
    prompts = [tokenizer.encode(p) for p in (PROMPTS * 4)[:num_prompts]]
    budget = max(len(p) for p in prompts) + max(forced_tokens, greedy_tokens) + BLOCK
    blocks = len(prompts) * -(-budget // BLOCK)
    dense = ModelRunner(path, block_size=BLOCK, num_blocks=blocks)
    int8 = ModelRunner(path, block_size=BLOCK, num_blocks=blocks, kv_cache_dtype="int8")
    with torch.inference_mode():
        # Teacher-forced: every position's distributions side by side.
        a, b = Batch(dense, prompts, budget), Batch(int8, prompts, budget)
        kls: list[float] = []
        agree: list[bool] = []
        la, lb = a.prefill(), b.prefill()
        for step in range(forced_tokens):
            pa, pb = torch.log_softmax(la, -1), torch.log_softmax(lb, -1)
            kls += torch.sum(pa.exp() * (pa - pb), -1).clamp_min(0).tolist()
            agree += (la.argmax(-1) == lb.argmax(-1)).tolist()
            if step + 1 < forced_tokens:
                forced = [out[-1] for out in a.outputs()]
                la, lb = a.decode(), b.decode(forced)
        # Free-running greedy.
        a, b = Batch(dense, prompts, budget), Batch(int8, prompts, budget)
        for r in (dense, int8):
            r.requests.clear()
        a.prefill()
        b.prefill()
        for _ in range(greedy_tokens - 1):
            a.decode()
            b.decode()
        divergence = []
        for x, y in zip(a.outputs(), b.outputs(), strict=True):
            first = next((i for i, (s, t) in enumerate(zip(x, y, strict=False)) if s != t), len(x))
            divergence.append(first)
    kls_sorted = sorted(kls)
    return {
        "model": model,
        "weights": dense.runtime["weights"],
        "prompts": len(prompts),
        "forced_tokens": forced_tokens,
        "greedy_tokens": greedy_tokens,
        "mean_kl": statistics.fmean(kls),
        "p99_kl": kls_sorted[int(0.99 * (len(kls_sorted) - 1))],
        "max_kl": kls_sorted[-1],
        "top1_agreement": sum(agree) / len(agree),
        "greedy_identical": sum(d == greedy_tokens for d in divergence) / len(divergence),
        "greedy_median_first_divergence": statistics.median(divergence),
        "greedy_first_divergence": divergence,
        "bytes_per_token": {
            "float32": dense.pool_sizing.bytes_per_token,
            "int8": int8.pool_sizing.bytes_per_token,
        },
    }


def policy_check(result: dict[str, Any]) -> list[str]:
    """What breaks the policy (empty: within it)."""
    broken = []
    if result["mean_kl"] > POLICY["mean_kl_max"]:
        broken.append(f"mean KL {result['mean_kl']:.2e} > {POLICY['mean_kl_max']}")
    if result["p99_kl"] > POLICY["p99_kl_max"]:
        broken.append(f"p99 KL {result['p99_kl']:.2e} > {POLICY['p99_kl_max']}")
    if result["top1_agreement"] < POLICY["top1_agreement_min"]:
        broken.append(f"top-1 agreement {result['top1_agreement']:.4f} < {POLICY['top1_agreement_min']}")
    if result["greedy_median_first_divergence"] < POLICY["greedy_median_first_divergence_min"]:
        broken.append(
            f"greedy outputs diverge after {result['greedy_median_first_divergence']} tokens (median) "
            f"< {POLICY['greedy_median_first_divergence_min']}"
        )
    return broken


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flag(ap, "model")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--forced-tokens", type=int, default=128)
    ap.add_argument("--greedy-tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, default=Path("bench/results/kv-int8-quality.json"))
    args = ap.parse_args(argv)
    result = evaluate(args.model, args.prompts, args.forced_tokens, args.greedy_tokens)
    result["policy"] = POLICY
    result["policy_broken"] = policy_check(result)
    print(json.dumps({k: v for k, v in result.items() if k != "greedy_first_divergence"}, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if not result["policy_broken"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
