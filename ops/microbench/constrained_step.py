"""What a JSON-schema constraint costs a decode step: every row constrained against none, batch 64.

    .venv/bin/python -m pagedserve.ops.microbench.constrained_step [--batch 64] [--steps 8]
                                                                   [--model smollm2-135m] [--out FILE]

One ModelRunner on the bundled SmolLM2-135M holds two groups of `--batch` requests with the same
prompts (16-256 tokens), temperature 0.6: one group unconstrained, one with every row under a JSON
schema whose documents do not end soon (so the rows stay constrained for the whole run). Decode
steps of the two groups alternate, so a shared, noisy machine moves them alike; the median of each
is reported, with the constrained step's mask building (matcher -> packed bitmask) and mask
application (-inf on the logits) timed inside it. Nothing crosses the wire per step for a
constraint (the matchers live on the worker), so "transfer" is 0 bytes. Also: the constraint's
compile time cold (a fresh compiler: tokenizer info + grammar) and cached.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import pagedserve.services.constraints.matcher as matcher_module
from pagedserve.kernels.cpu.isa import cpu_model
from pagedserve.ops.results import write_json
from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.constraints.compiler import ConstraintCompiler
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.config import add_config_flag
from pagedserve.shared.protocol.constraints import StructuredOutputs
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest, WorkerSampling

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "number"},
    },
    "required": ["title", "tags", "score"],
}


class Timer:
    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed


def compile_times(model_path: Path, vocab_size: int, eos: list[int]) -> dict[str, float]:
    t0 = time.perf_counter()
    compiler = ConstraintCompiler.for_model(model_path, vocab_size, eos)
    t1 = time.perf_counter()
    spec = StructuredOutputs(json=SCHEMA)
    compiler.compile(spec)
    t2 = time.perf_counter()
    cached = []
    for _ in range(20):
        t = time.perf_counter()
        compiler.compile(StructuredOutputs(json=SCHEMA))
        cached.append(time.perf_counter() - t)
    return {
        "tokenizer_info_ms": (t1 - t0) * 1e3,
        "compile_cold_ms": (t2 - t1) * 1e3,
        "compile_cached_ms": statistics.median(cached) * 1e3,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="constrained_step", description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    add_config_flag(parser, "model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    path = resolve_model(args.model)
    rng = random.Random(args.seed)
    block_size = 16
    lens = [rng.randint(16, 256) for _ in range(args.batch)]
    blocks_each = -(-(max(lens) + args.steps + 8) // block_size)
    runner = ModelRunner(path, block_size=block_size, num_blocks=2 * args.batch * blocks_each + 1)
    vocab = runner.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in lens]
    compile = compile_times(path, vocab, runner.eos_token_ids)

    plain = WorkerSampling.of(SamplingParams(temperature=0.6, max_tokens=1000), 1)
    constrained = WorkerSampling.of(
        SamplingParams(temperature=0.6, max_tokens=1000, structured_outputs=StructuredOutputs(json=SCHEMA)), 1
    )
    groups: dict[str, list[str]] = {"none": [], "json_schema": []}
    step = 0
    for g, (name, params) in enumerate((("none", plain), ("json_schema", constrained))):
        news = []
        for i, prompt in enumerate(prompts):
            rid = f"{name}-{i}"
            groups[name].append(rid)
            first = (g * args.batch + i) * blocks_each + 1
            news.append(
                NewRequest(
                    rid, prompt, len(prompt), 0, len(prompt), list(range(first, first + blocks_each)), params
                )
            )
        for chunk in range(0, len(news), 8):  # prefill in chunks of 8, as the scheduler would
            step += 1
            runner.execute(Execute(step, new_requests=news[chunk : chunk + 8]))

    mask_build, mask_apply = Timer(), Timer()
    runner.constraints.mask = mask_build.wrap(runner.constraints.mask)  # type: ignore[method-assign]
    matcher_module.apply_mask = mask_apply.wrap(matcher_module.apply_mask)
    times: dict[str, list[float]] = {"none": [], "json_schema": []}
    builds, applies = [], []
    for _ in range(args.steps + 1):  # the first pair warms up
        for name, ids in groups.items():
            step += 1
            mask_build.seconds = mask_apply.seconds = 0.0
            t0 = time.perf_counter()
            runner.execute(Execute(step, cached_requests=[CachedRequest(r, 1) for r in ids]))
            times[name].append(time.perf_counter() - t0)
            if name == "json_schema":
                builds.append(mask_build.seconds)
                applies.append(mask_apply.seconds)
    live = sum(
        1
        for r in groups["json_schema"]
        if runner.requests[r].matcher is not None and not runner.requests[r].matcher.finished
    )
    none_ms = statistics.median(times["none"][1:]) * 1e3
    json_ms = statistics.median(times["json_schema"][1:]) * 1e3
    report = {
        "cpu": cpu_model(default=platform.processor() or platform.machine()),
        "threads": torch.get_num_threads(),
        "model": args.model,
        "batch": args.batch,
        "steps": args.steps,
        "step_ms_none": round(none_ms, 2),
        "step_ms_json_schema": round(json_ms, 2),
        "slowdown_pct": round((json_ms / none_ms - 1) * 100, 2),
        "mask_build_ms": round(statistics.median(builds[1:]) * 1e3, 3),
        "mask_apply_ms": round(statistics.median(applies[1:]) * 1e3, 3),
        "wire_bytes_per_step": 0,
        "constrained_rows_still_live": live,
        **{k: round(v, 3) for k, v in compile.items()},
    }
    print(json.dumps(report, indent=2))
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()
