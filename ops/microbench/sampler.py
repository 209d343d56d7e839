"""Micro-benchmark: one Sampler.sample call over a SmolLM2-sized vocabulary, per batch size and setting.

    python -m pagedserve.ops.microbench.sampler [--batches 1 32 256] [--threads 1] [--out bench/results/sampler.json]

Logits are N(0, 3^2): flatter than a real model's, so top-p nuclei are wide (a few hundred tokens)
and the top-k/top-p candidate search is near its worst case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from pagedserve.services.worker.sampler import Sampler, SamplingRequest
from pagedserve.shared.protocol.frontend import SamplingParams

VOCAB = 49152
SETTINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "temperature": {"temperature": 0.8},
    "top_k=50": {"temperature": 0.8, "top_k": 50},
    "top_p=0.9": {"temperature": 0.8, "top_p": 0.9},
    "min_p=0.1": {"temperature": 0.8, "min_p": 0.1},
    "seeded": {"temperature": 0.8, "seed": 3},
    "penalties": {"temperature": 0.8, "repetition_penalty": 1.2, "frequency_penalty": 0.5},
    "logprobs=5": {"temperature": 0.0, "logprobs": 5},
}


def time_sample(
    sampler: Sampler, logits: torch.Tensor, requests: list[SamplingRequest], repeats: int
) -> float:
    sampler.sample(logits, requests)  # warm-up
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        sampler.sample(logits, requests)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench/results/sampler.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sampler = Sampler(VOCAB, eos_token_ids=[2])
    results: dict[str, dict[int, float]] = {name: {} for name in SETTINGS}
    for batch in args.batches:
        logits = torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(batch)) * 3
        for name, params in SETTINGS.items():
            fields = SamplingParams(**params).model_dump()
            # 64 prompt and 64 output tokens each, as a mid-generation decode step.
            requests = [SamplingRequest(fields, list(range(64)), list(range(100, 164))) for _ in range(batch)]
            results[name][batch] = round(time_sample(sampler, logits, requests, args.repeats) * 1e3, 2)
    print(f"Sampler.sample ms (median), vocab {VOCAB}, {args.threads} thread(s)")
    print(f"{'setting':>12} | " + " | ".join(f"B={b:<5}" for b in args.batches))
    for name, by_batch in results.items():
        print(f"{name:>12} | " + " | ".join(f"{by_batch[b]:>7.2f}" for b in args.batches))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"vocab": VOCAB, "threads": args.threads, "ms": results}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
