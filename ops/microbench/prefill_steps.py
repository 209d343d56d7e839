"""Prefill steps of the model runner alone: tokens/s and the minor page faults of each step.

    .venv/bin/python -m pagedserve.ops.microbench.prefill_steps [--model FOLDER] [--prompt-len 128]
                                                                [--prompts 16] [--steps 5] [--threads 2]
                                                                [--quantization gguf] [--out FILE.json]

Each step prefills `--prompts` new prompts of `--prompt-len` random tokens in one Execute (16 x 128:
a 2048-token chunk, the scheduler's default budget), with no scheduler, block manager or sockets.
Prints every step's tokens/s and minor page faults, and the median of the steps after the first (the
first one grows the process's buffers). Faults are the process's own (getrusage), so a step that
allocates its large buffers afresh each time shows it (services/worker/heap.py). Set
PAGEDSERVE_QUANT_ACTIVATIONS as the server would run.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time
from pathlib import Path

import torch

from pagedserve.ops.results import write_json
from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.config import add_config_flag
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import Execute, NewRequest, WorkerSampling


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flag(ap, "model")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    add_config_flag(ap, "quantization", "gguf")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    block_size = 16
    blocks_each = -(-(args.prompt_len + 1) // block_size)  # room for the token each prompt samples
    runner = ModelRunner(
        resolve_model(args.model),
        dtype="float32",
        block_size=block_size,
        num_blocks=args.prompts * args.steps * blocks_each + 1,
        attention_backend="cpp",
        quantization=args.quantization,
    )
    rng = random.Random(0)
    params = WorkerSampling.of(SamplingParams(temperature=0.6, ignore_eos=True), None)
    tokens = args.prompts * args.prompt_len
    rates, faults = [], []
    for step in range(args.steps):
        news = []
        for i in range(args.prompts):
            first = (step * args.prompts + i) * blocks_each + 1
            prompt = [rng.randrange(runner.vocab_size) for _ in range(args.prompt_len)]
            n = args.prompt_len
            news.append(
                NewRequest(f"p{step}-{i}", prompt, n, 0, n, list(range(first, first + blocks_each)), params)
            )
        before, start = minor_faults(), time.perf_counter()
        runner.execute(Execute(step + 1, new_requests=news))
        rates.append(tokens / (time.perf_counter() - start))
        faults.append(minor_faults() - before)
        print(f"step {step}: {rates[-1]:.0f} tok/s, {faults[-1]} minor faults", flush=True)
    median = statistics.median(rates[1:] or rates)
    print(f"{args.prompts} x {args.prompt_len} tokens a step: median {median:.0f} tok/s after the first step")
    if args.out:
        write_json(
            args.out,
            {
                "model": args.model,
                "prompts": args.prompts,
                "prompt_len": args.prompt_len,
                "threads": args.threads,
                "tok_s": [round(r, 1) for r in rates],
                "minor_faults": faults,
                "median_tok_s_after_first": round(median, 1),
            },
        )


if __name__ == "__main__":
    main()
