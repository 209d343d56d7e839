"""LoRA speed on the bundled model (SmolLM2-135M): total generated tok/s with requests spread over N
adapters of rank R, against the same requests on the base model; and how long hot-loading one adapter
takes, with the step times of running requests around it.

Runs the in-process engine (LLM: scheduler, block manager, worker runner), greedy, ignore_eos, so every
configuration generates exactly the same number of tokens. The adapters are made here with PEFT
(random A and B, every attention and MLP projection). Run alone:

    .venv/bin/python -m pagedserve.ops.microbench.lora_speed --out bench/results/lora-speed.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from pagedserve.kernels.cpu.isa import cpu_model
from pagedserve.shared.config import add_config_flag


def make_adapters(config: dict[str, Any], root: Path, count: int, rank: int) -> dict[str, str]:
    """`count` random adapters for a model of `config` (the bundled model is a GGUF: PEFT only needs
    the module names and shapes, so the transformers model it wraps is built from the config)."""
    import peft
    import transformers

    fields = dict(config)
    hf = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    model = transformers.AutoModelForCausalLM.from_config(hf, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    out = {}
    for i in range(count):
        config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False)
        peft_model = peft.get_peft_model(model, config)
        with torch.no_grad():
            gen = torch.Generator().manual_seed(i)
            for name, p in peft_model.named_parameters():
                if "lora_" in name:
                    p.copy_(0.02 * torch.randn(p.shape, generator=gen))
        peft_model.save_pretrained(root / f"lora{i}")
        model = peft_model.unload()
        out[f"lora{i}"] = str(root / f"lora{i}")
    return out


def parse_cases(text: str) -> list[tuple[int, int]]:
    """ "8:4,64:8" -> [(8, 4), (64, 8)]: requests over adapters."""
    return [
        (int(requests), int(adapters)) for requests, adapters in (c.split(":") for c in text.split(",") if c)
    ]


def bench_prompts(requests: int, length: int) -> list[list[int]]:
    """The benches' prompts: `requests` distinct ones of `length` tokens, the same every run."""
    return [[(7 * i + 13 * j) % 4000 + 100 for j in range(length)] for i in range(requests)]


def result_header(args: argparse.Namespace, **settings: object) -> dict[str, object]:
    """What every LoRA bench's JSON starts with: the CPU, threads, rank and slots' dtype, then `settings`."""
    return {
        "cpu": cpu_model(platform.processor()),
        "threads": args.threads,
        "rank": args.rank,
        "lora_dtype": args.lora_dtype,
        **settings,
        "cases": [],
    }


def run(llm, prompts: list[list[int]], loras: list[str | None], max_tokens: int) -> dict[str, float]:
    from pagedserve import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), lora=loras[:2])
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, lora=loras)
    seconds = time.perf_counter() - started
    tokens = sum(len(o.token_ids) for o in outputs)
    return {"seconds": seconds, "tokens": tokens, "tok_s": tokens / seconds}


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]


def pooled_stall(loads: list[dict]) -> dict[str, float]:
    """Every load's window steps against every load's steps before it: a p99 of a few dozen steps
    rather than of one window's handful (which is its maximum, and the machine's noise with it)."""
    window = [s for load in loads for s in load.get("steps_in_window_s", [])]
    before = [s for load in loads for s in load["steps_before_s"]]
    return {
        "steps_in_windows": len(window),
        "steps_before": len(before),
        "step_p99_in_windows_s": p99(window),
        "step_p99_before_s": p99(before),
        "p99_ratio": p99(window) / p99(before),
        "median_ratio": statistics.median(window) / statistics.median(before),
        "load_s_max": max(load["load_s"] for load in loads),
    }


def hot_load_stall(
    llm, spare: str, args: argparse.Namespace, running: int = 8, cached: str | None = None, name: str = "hot"
) -> dict[str, object]:
    """While `running` requests decode (base model), a new request names an adapter the worker has
    never read (registered with the scheduler only: the path a fresh worker takes). Wall time of every
    engine step; the window is the steps from the new request's arrival until its adapter is in the
    worker's cache (the read, in slices between steps). -> the load time and step-time p99 before / in
    the window, and the step the new request joins in (its prefill: what any arrival costs), beside
    the median step before it.
    `cached`: the new request names that adapter instead, already read: the same arrival without a
    load, whose join step is the baseline of the hot load's."""
    from pagedserve import SamplingParams
    from pagedserve.engine.engine import RequestDone
    from pagedserve.services.scheduler.outputs import OutputEvent

    loras = llm.runner.loras
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    now = time.monotonic()
    for i in range(running):
        prompt = [(11 * i + 5 * j) % 4000 + 100 for j in range(args.prompt_len)]
        llm.scheduler.add_request(f"stall-{name}-{i}", prompt, params, now)
    before: list[float] = []
    window: list[float] = []
    arrived_at = None
    join_s = None
    load_s = 0.0
    done = 0
    step = 0
    new_id = f"stall-{name}-new"
    while done < running + 1:
        if step == args.prompt_len // 4 + 20 and arrived_at is None:  # well into the decode
            module = (
                llm.scheduler.loras.add(name, spare) if cached is None else llm.scheduler.loras.get(cached)
            )
            llm.scheduler.add_request(
                new_id, [101 + j for j in range(8)], params, time.monotonic(), lora=module
            )
            arrived_at = step
        loads = loras.num_loads
        started = time.perf_counter()
        events = llm.engine.step()
        seconds = time.perf_counter() - started
        if loras.num_loads != loads:
            load_s = loras.last_load_s
        joined = join_s is None and any(isinstance(e, OutputEvent) and e.request_id == new_id for e in events)
        if joined:
            join_s = seconds
        if arrived_at is None:
            if step >= 4:  # past the prefill
                before.append(seconds)
        elif cached is None and not joined and (name not in loras.cached or loras.num_loads != loads):
            window.append(seconds)
        done += sum(isinstance(e, RequestDone) for e in events)
        step += 1
    llm.engine.flush()

    median_before = statistics.median(before)
    assert join_s is not None
    stall: dict[str, object] = {
        "running": running,
        "load_s": load_s,
        "steps_before": len(before),
        "step_p99_before_s": p99(before),
        "step_median_before_s": median_before,
        "steps_before_s": [round(s, 5) for s in before],
        "join_step_s": join_s,
        "join_to_median_before": join_s / median_before,
        "direct_reads": loras.direct_reads,
    }
    if window:
        stall |= {
            "steps_in_window": len(window),
            "steps_in_window_s": [round(s, 5) for s in window],
            "step_p99_in_window_s": p99(window),
            "p99_ratio": p99(window) / p99(before),
            "median_ratio": statistics.median(window) / median_before,
        }
    return stall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cases", default="8:4,64:8", help="requests:adapters, comma-separated ('' = none)")
    parser.add_argument("--hot-loads", type=int, default=3, help="hot loads measured, each a new adapter")
    parser.add_argument("--repeats", type=int, default=3, help="base/LoRA run pairs per case (median ratio)")
    parser.add_argument(
        "--torch-paths", action="store_true", help="LoRA deltas by torch's GEMMs, not the C++ kernel (A/B)"
    )
    parser.add_argument(
        "--fused-layers",
        choices=["on", "off"],
        default="on",
        help="decoder layers as one C++ call where they qualify, adapters included (off: A/B)",
    )
    add_config_flag(parser, "lora_dtype")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from pagedserve import LLM
    from pagedserve.services.checkpoint import load_checkpoint

    base = load_checkpoint("smollm2-135m").config
    cases = parse_cases(args.cases)
    most = max([a for _, a in cases] or [1])
    results = result_header(
        args, max_tokens=args.max_tokens, prompt_len=args.prompt_len, repeats=args.repeats
    )
    with tempfile.TemporaryDirectory() as tmp:
        adapters = make_adapters(base, Path(tmp), most + args.hot_loads, args.rank)
        spares = [adapters.pop(f"lora{most + i}") for i in range(args.hot_loads)]
        llm = LLM(
            "smollm2-135m",
            max_loras=most,
            max_cpu_loras=most + args.hot_loads,
            lora_modules=adapters,
            lora_dtype=args.lora_dtype,
        )
        llm.runner.loras.batch.cpp = not args.torch_paths
        results["lora_kernel"] = "torch" if args.torch_paths else "cpp"
        results["fused_layers"] = llm.runner.model.use_fused_layers(args.fused_layers == "on")
        for requests, count in cases:
            prompts = bench_prompts(requests, args.prompt_len)
            names = [f"lora{i % count}" for i in range(requests)]
            base_runs, lora_runs = [], []
            for _ in range(args.repeats):  # interleaved, so a drift in the machine's speed moves both
                base_runs.append(run(llm, prompts, [None] * requests, args.max_tokens))
                lora_runs.append(run(llm, prompts, names, args.max_tokens))
            ratios = [lora["tok_s"] / base["tok_s"] for base, lora in zip(base_runs, lora_runs, strict=True)]
            case = {
                "requests": requests,
                "adapters": count,
                "base": base_runs,
                "lora": lora_runs,
                "ratios": ratios,
                "ratio": statistics.median(ratios),
            }
            results["cases"].append(case)  # type: ignore[union-attr]
            print(json.dumps(case))
        results["hot_loads"] = []
        if spares:  # --hot-loads 0: the speed cases only
            # the baseline first, while lora0 is still in a slot (the hot load may evict it)
            results["cached_arrival"] = arrival = hot_load_stall(
                llm, spares[0], args, cached="lora0", name="cached"
            )
            print(json.dumps({"cached_arrival": arrival}))
        for i, spare in enumerate(spares):
            hot_load = hot_load_stall(llm, spare, args, name=f"hot{i}")
            results["hot_loads"].append(hot_load)  # type: ignore[union-attr]
            print(json.dumps({"hot_load": hot_load}))
        if spares:
            results["hot_loads_pooled"] = pooled = pooled_stall(results["hot_loads"])  # type: ignore[arg-type]
            print(json.dumps({"hot_loads_pooled": pooled}))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
