"""LoRA's cost per decode step on the bundled model (SmolLM2-135M): the same requests decoding on an
engine with adapters (rows spread over N adapters of rank R) and on an engine without LoRA, in one
process, their steps alternated round by round (each engine steps once a round, so all hold the same
contexts) so that a drift in the machine's speed moves both.

`lora_speed` times whole runs, base then LoRA, which on a shared VM spread as much as the gap they
measure (0.70-1.14x for the same code); here each configuration's median step comes from rounds
interleaved within seconds, in a shuffled order. Decode steps of equal rows make equal tokens, so the
ratio of the base's step time to the adapters' is the ratio of their tok/s. The adapted engine runs
with its decoder layers as one C++ call (`on`) and in Python (`off`): an engine each. Run alone:

    .venv/bin/python -m pagedserve.ops.microbench.lora_steps [--cases 8:4,64:8] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from pagedserve.ops.microbench.lora_speed import bench_prompts, make_adapters, parse_cases, result_header
from pagedserve.shared.config import add_config_flag


def _add_requests(llm, requests: int, names: list[str | None], max_tokens: int) -> None:
    from pagedserve import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    now = time.monotonic()
    for i, (prompt, name) in enumerate(zip(bench_prompts(requests, 32), names, strict=True)):
        module = None if name is None else llm.scheduler.loras.get(name)
        llm.scheduler.add_request(f"steps-{i}", prompt, params, now, lora=module)


def case(args: argparse.Namespace, requests: int, count: int, adapters: dict[str, str]) -> dict[str, object]:
    from pagedserve import LLM

    names = [f"lora{i % count}" for i in range(requests)]
    used = {name: adapters[name] for name in sorted(set(names))}
    max_tokens = args.rounds * (args.steps + 1) + 16  # every request decodes through the last round
    engines = {"base": LLM("smollm2-135m", lora_dtype=args.lora_dtype)}
    for fused in args.fused_layers:  # an engine each, so that every engine's requests hold equal contexts
        adapted = LLM("smollm2-135m", max_loras=count, lora_modules=used, lora_dtype=args.lora_dtype)
        adapted.runner.model.use_fused_layers(fused == "on")
        engines[f"lora/{fused}"] = adapted
    for name, llm in engines.items():
        _add_requests(llm, requests, [None] * requests if name == "base" else names, max_tokens)
        for _ in range(4):  # the prefills, and the first decode steps
            llm.engine.step()
    configs = list(engines.items())
    times: dict[str, list[float]] = {name: [] for name in engines}
    order = random.Random(0)
    for _ in range(args.rounds):
        order.shuffle(configs)  # no configuration always follows the same one (its caches' leftovers)
        for name, llm in configs:
            llm.engine.step()  # the switch's own step, untimed
            for _ in range(args.steps):
                started = time.perf_counter()
                llm.engine.step()
                times[name].append(time.perf_counter() - started)
                if llm.scheduler.num_running != requests:  # preempted or finished: not this case's step
                    raise SystemExit(f"{name}: {llm.scheduler.num_running} of {requests} requests running")
    for llm in engines.values():
        for i in range(requests):
            llm.scheduler.abort(f"steps-{i}")
        llm.engine.flush()
    medians = {name: statistics.median(values) * 1000 for name, values in times.items()}
    return {
        "requests": requests,
        "adapters": count,
        "step_ms": medians,
        "ratio_to_base": {name: medians["base"] / ms for name, ms in medians.items() if name != "base"},
        "steps_each": len(times["base"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="8:4,64:8", help="requests:adapters, comma-separated")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per configuration per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fused-layers", nargs="+", choices=["on", "off"], default=["on", "off"])
    add_config_flag(parser, "lora_dtype")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from pagedserve.services.checkpoint import load_checkpoint

    cases = parse_cases(args.cases)
    results = result_header(args, rounds=args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        adapters = make_adapters(
            load_checkpoint("smollm2-135m").config, Path(tmp), max(a for _, a in cases), args.rank
        )
        for requests, count in cases:
            result = case(args, requests, count, adapters)
            results["cases"].append(result)  # type: ignore[union-attr]
            print(json.dumps(result), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
