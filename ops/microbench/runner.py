"""Benchmark: decode tokens/s of the model runner alone on SmolLM2-135M, next to transformers' generate.

    python -m pagedserve.ops.microbench.runner [--batches 1 8 32] [--dtype float32] [--threads N]
                                               [--out bench/results/runner.json]

Both sides get the same prompts (--prompt-len random tokens, no padding), greedy decoding, the same
dtype and the same torch threads. Decode tokens/s = batch * decode steps / decode time:
- runner: one prefill Execute, then --decode-steps single-token Executes, timed alone;
- transformers: generate(max_new_tokens=steps + 1) minus generate(max_new_tokens=1) (its prefill),
  with min_new_tokens so EOS cannot end a row early.
The runner's side uses no scheduler, block manager or sockets: it is the worker's compute ceiling.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from pagedserve.ops.results import write_json
from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.config import add_config_flag
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest, WorkerSampling

BLOCK_SIZE = 16


def make_prompts(batch: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab_size) for _ in range(length)] for _ in range(batch)]


def runner_decode_seconds(
    runner: ModelRunner, prompts: list[list[int]], steps: int
) -> tuple[list[float], list[float]]:
    """Prefill every prompt in one step, then time each of `steps` batched decode steps.
    -> (seconds per step, the sampler's seconds per step as the runner reports them)."""
    greedy = WorkerSampling.of(SamplingParams(temperature=0.0, ignore_eos=True), None)
    blocks_each = -(-(len(prompts[0]) + steps + 1) // BLOCK_SIZE)
    tables = [list(range(i * blocks_each, (i + 1) * blocks_each)) for i in range(len(prompts))]
    ids = [f"bench-{i}" for i in range(len(prompts))]
    # The whole table up front: growing it step by step costs the runner nothing measurable.
    prefill = Execute(
        0,
        new_requests=[
            NewRequest(rid, p, len(p), 0, len(p), table, greedy)
            for rid, p, table in zip(ids, prompts, tables, strict=True)
        ],
    )
    runner.execute(prefill)
    seconds, sampling = [], []
    for step in range(1, steps + 1):
        decode = Execute(step, cached_requests=[CachedRequest(rid, 1) for rid in ids])
        started = time.perf_counter()
        result = runner.execute(decode)
        seconds.append(time.perf_counter() - started)
        sampling.append(result.timings.get("sample_s", 0.0))
    runner.execute(Execute(steps + 1, finished_ids=ids))  # frees the requests for the next batch
    return seconds, sampling


@torch.inference_mode()
def transformers_decode_seconds(model: Any, prompts: list[list[int]], steps: int) -> float:
    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)

    def generate(new_tokens: int) -> float:
        started = time.perf_counter()
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        return time.perf_counter() - started

    prefill = generate(1)
    return generate(steps + 1) - prefill


def format_row(row: dict[str, Any]) -> str:
    theirs = row["transformers_tok_s"]
    ratio = f"{row['runner_tok_s'] / theirs:5.2f}" if theirs else "    -"
    return (
        f"{row['batch']:>5} | {row['runner_tok_s']:>12.1f} | {row['runner_step_ms_median']:>8.1f} | "
        f"{row['sampler_ms_median']:>10.2f} | {theirs if theirs else '-':>18} | {ratio}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flag(ap, "model")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=64)
    add_config_flag(ap, "dtype", "float32")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--out", default="bench/results/runner.json")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)  # both sides, before either runs
    # Other work on these shared cores moves every number: the load before and after says how much.
    load_at_start = os.getloadavg()[0]
    path = resolve_model(args.model)
    dtype = getattr(torch, args.dtype)
    largest = max(args.batches)
    blocks = largest * -(-(args.prompt_len + args.decode_steps + 1) // BLOCK_SIZE)
    runner = ModelRunner(path, dtype=args.dtype, block_size=BLOCK_SIZE, num_blocks=blocks)
    reference = None
    if not args.skip_transformers:
        from transformers import AutoModelForCausalLM

        reference = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()

    # Warm-up: first calls allocate and pick kernels.
    warm = make_prompts(2, args.prompt_len, runner.vocab_size, seed=99)
    runner_decode_seconds(runner, warm, 4)
    if reference is not None:
        transformers_decode_seconds(reference, warm, 4)

    rows = []
    print(
        f"SmolLM2-135M {args.dtype}, {args.threads} threads, prompt {args.prompt_len}, {args.decode_steps} decode steps"
    )
    print(
        f"{'batch':>5} | {'runner tok/s':>12} | {'step ms':>8} | {'sampler ms':>10} | {'transformers tok/s':>18} | ratio"
    )
    for batch in args.batches:
        prompts = make_prompts(batch, args.prompt_len, runner.vocab_size, seed=batch)
        steps, sampling = runner_decode_seconds(runner, prompts, args.decode_steps)
        row = {
            "batch": batch,
            "runner_tok_s": round(batch * args.decode_steps / sum(steps), 1),
            "runner_step_ms_median": round(statistics.median(steps) * 1e3, 2),
            "sampler_ms_median": round(statistics.median(sampling) * 1e3, 2),
            "transformers_tok_s": None,
        }
        if reference is not None:
            seconds = transformers_decode_seconds(reference, prompts, args.decode_steps)
            row["transformers_tok_s"] = round(batch * args.decode_steps / seconds, 1)
        rows.append(row)
        print(format_row(row), flush=True)

    report = {
        "model": args.model,
        "dtype": args.dtype,
        "threads": args.threads,
        "prompt_len": args.prompt_len,
        "decode_steps": args.decode_steps,
        "attention_backend": runner.attention_backend,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_start": load_at_start,
        "load_avg_1m_at_end": os.getloadavg()[0],
        "rows": rows,
    }
    cores = os.cpu_count() or 1
    start, end = report["load_avg_1m_at_start"], report["load_avg_1m_at_end"]
    busy = " (a busy machine: numbers are noisy)" if max(start, end) > cores else ""
    print(f"load average {start:.1f} at start, {end:.1f} at end, {cores} cores{busy}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, report)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
