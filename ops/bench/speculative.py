"""`pagedserve bench speculative`: tokens/s with and without speculative decoding, per workload and load.

    pagedserve bench speculative                          # every workload at 1, 4, 16 concurrent
    pagedserve bench speculative --workloads code_edit --concurrency 1 --max-tokens 128

The workloads (ops/bench/spec_workloads.py): code editing, quoting / summarising a document, multi-turn
chat over a fixed context, open chat. The bundled model answers them with its real outputs, greedy,
through the in-process engine (`LLM.generate`) with the model's chat template: at concurrency c the
first c conversations of a workload go in at once, after a warm-up run of the same engine. Each cell
runs without speculation and with it (`--speculative-config`), on engines made once per mode. The
outputs of the two runs are compared token for token (greedy: they must be equal, up to float
rounding where a near-tie flips with the batch's shape). Reports tokens/s, the speed-up, the acceptance
rate (accepted / proposed) and steps; writes JSON and a PNG chart (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pagedserve.ops.results import write_json
from pagedserve.shared.config import add_config_flag

ONE_USER_CHATS = 4  # concurrency 1: this many chats, one after another
DEFAULT_SPEC = (
    '{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from pagedserve.ops.bench.spec_workloads import WORKLOADS

    ap = argparse.ArgumentParser(prog="pagedserve bench speculative", description=__doc__)
    add_config_flag(ap, "model")
    add_config_flag(ap, "quantization", "auto")
    add_config_flag(ap, "quant_activations")  # unset: PAGEDSERVE_QUANT_ACTIVATIONS, else float32
    add_config_flag(ap, "kv_cache_dtype")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    ap.add_argument("--concurrency", default="1,4,16", help="comma list: conversations submitted at once")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--speculative-config", default=DEFAULT_SPEC, help="JSON, vLLM's shape")
    add_config_flag(ap, "pipeline_depth", 2)
    ap.add_argument(
        "--llamacpp",
        action="store_true",
        help="also llama.cpp at concurrency 1, without and with its prompt lookup (ops/bench/llamacpp_spec_peer.py)",
    )
    ap.add_argument("--out", type=Path, default=Path("bench/results/speculative.json"))
    return ap.parse_args(argv)


def run_cell(
    llm: Any, chats: list[list[dict[str, str]]], max_tokens: int, one_at_a_time: bool
) -> dict[str, Any]:
    """Every chat at once, or (one_at_a_time) each alone after the last: one user's speed."""
    from pagedserve import SamplingParams

    prompts = [
        llm.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats
    ]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    stats = llm.scheduler.stats
    before = (stats.spec_proposed, stats.spec_accepted, stats.steps)
    started = time.perf_counter()
    batches = [[p] for p in prompts] if one_at_a_time else [prompts]
    outs = [o for batch in batches for o in llm.generate(batch, params, use_tqdm=False)]
    wall = time.perf_counter() - started
    tokens = sum(len(o.token_ids) for o in outs)
    proposed, accepted = stats.spec_proposed - before[0], stats.spec_accepted - before[1]
    return {
        "requests": len(chats),
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 2),
        "steps": stats.steps - before[2],
        "proposed": proposed,
        "accepted": accepted,
        "acceptance": round(accepted / proposed, 4) if proposed else None,
        "outputs": [o.token_ids for o in outs],
        "prompt_token_ids": [llm.encode(p) for p in prompts],
    }


def merge_cells(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs of one mode, one after another, as one: their counts and times summed."""
    total = {
        key: sum(c[key] for c in cells)
        for key in ("requests", "output_tokens", "steps", "proposed", "accepted")
    }
    wall = sum(c["wall_s"] for c in cells)
    return {
        **total,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(total["output_tokens"] / wall, 2),
        "acceptance": round(total["accepted"] / total["proposed"], 4) if total["proposed"] else None,
        "outputs": [o for c in cells for o in c["outputs"]],
        "prompt_token_ids": [p for c in cells for p in c["prompt_token_ids"]],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from pagedserve import LLM
    from pagedserve.ops.bench.report import machine_info
    from pagedserve.ops.bench.spec_workloads import WORKLOADS

    torch.set_num_threads(args.threads)
    workloads = [w for w in args.workloads.split(",") if w]
    levels = [int(c) for c in args.concurrency.split(",") if c]
    spec = json.loads(args.speculative_config)
    load_at_start = list(os.getloadavg())
    engines = {
        mode: LLM(
            args.model,
            quantization=args.quantization,
            quant_activations=args.quant_activations,
            kv_cache_dtype=args.kv_cache_dtype,
            pipeline_depth=args.pipeline_depth,
            speculative_config=spec if mode == "speculative" else None,
        )
        for mode in ("baseline", "speculative")
    }
    rows: list[dict[str, Any]] = []
    for name in workloads:
        chats = WORKLOADS[name]()
        for level in levels:
            row: dict[str, Any] = {"workload": name, "concurrency": level}
            # One user: the first ONE_USER_CHATS chats, each alone; else the first `level` at once.
            batch = chats[:ONE_USER_CHATS] if level == 1 else chats[:level]
            for llm in engines.values():
                run_cell(llm, batch[:1], 8, True)  # warm: kernels, the chat template, this prompt length
            # The two modes take turns, so that a slow spell of a shared machine falls on both (one
            # mode's four chats, then the other's, put a 0.83x and a 1.41x on the same cell of two runs):
            # one user chat by chat; at once, the whole batch twice (the second round finds its prompts
            # in the prefix cache, in both engines alike).
            turns = [[chat] for chat in batch] if level == 1 else [batch, batch]
            runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in engines}
            for turn in turns:
                for mode, llm in engines.items():
                    runs[mode].append(run_cell(llm, turn, args.max_tokens, level == 1))
            for mode in engines:
                row[mode] = merge_cells(runs[mode])
            base, spec_run = row["baseline"], row["speculative"]
            row["speedup"] = round(spec_run["tokens_per_s"] / base["tokens_per_s"], 3)
            # the price of a proposal row the policy used by the cell's end (configured, or measured)
            spec_run["row_cost"] = round(engines["speculative"].scheduler.speculation.row_cost, 3)
            prompt_ids = base.pop("prompt_token_ids")
            spec_run.pop("prompt_token_ids")
            base_outputs = base.pop("outputs")
            row["identical_outputs"] = sum(
                a == b for a, b in zip(base_outputs, spec_run.pop("outputs"), strict=True)
            )
            if level == 1 and args.llamacpp:
                row["llamacpp"] = run_llamacpp_lookup(prompt_ids, args.max_tokens, args.threads)
            rows.append(row)
            print(
                f"{name:11s} c={level:<3d} base {base['tokens_per_s']:7.1f} tok/s  spec "
                f"{spec_run['tokens_per_s']:7.1f} tok/s  x{row['speedup']:.2f}  acceptance "
                f"{spec_run['acceptance']}  row cost {spec_run['row_cost']}  "
                f"identical {row['identical_outputs']}/{len(base_outputs)}"
                + (f"  llama.cpp {row['llamacpp']}" if "llamacpp" in row else ""),
                flush=True,
            )
    report = {
        "machine": {**machine_info(), "load_average_at_start": load_at_start},
        "config": {
            "model": args.model,
            "quantization": args.quantization,
            "threads": args.threads,
            "max_tokens": args.max_tokens,
            "pipeline_depth": args.pipeline_depth,
            "speculative_config": spec,
            "runtime": engines["baseline"].runner.runtime,
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    png = args.out.with_suffix(".png")
    write_chart(report, png)
    print(f"wrote {args.out} and {png}")
    return 0


def run_llamacpp_lookup(prompts: list[list[int]], max_tokens: int, threads: int) -> dict[str, Any]:
    """llama-cpp-python on the checkpoint's GGUF, the same prompt tokens one at a time, greedy, without
    and with its prompt-lookup draft (LlamaPromptLookupDecoding), in llama.cpp's own venv."""
    from pathlib import Path as _Path

    from pagedserve.ops.bench.llamacpp_server import llamacpp_venv, llamacpp_venv_ready
    from pagedserve.ops.bench.peer_process import run_peer_process
    from pagedserve.services.checkpoint import resolve_model
    from pagedserve.services.worker.weights.gguf_weights import gguf_source

    venv = llamacpp_venv()
    if not llamacpp_venv_ready(venv):
        return {"error": f"no llama.cpp venv at {venv}"}
    gguf = gguf_source(resolve_model("smollm2-135m"))
    request = {"gguf_path": str(gguf), "threads": threads, "prompts": prompts, "max_tokens": max_tokens}
    script = _Path(__file__).with_name("llamacpp_spec_peer.py")
    result = run_peer_process("llamacpp-lookup", venv / "bin" / "python", script, request, 1800)
    return {"error": result.error, **(result.details or {})}


def write_chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    levels = list(dict.fromkeys(r["concurrency"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(levels))
    for i, level in enumerate(levels):
        xs, ys = [], []
        for j, name in enumerate(workloads):
            for r in rows:
                if r["workload"] == name and r["concurrency"] == level:
                    xs.append(j + i * width)
                    ys.append(r["speedup"])
        bars = ax.bar(xs, ys, width, label=f"{level} concurrent")
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([j + width * (len(levels) - 1) / 2 for j in range(len(workloads))], workloads)
    ax.set_ylabel("tok/s with speculation / without")
    cpu = report["machine"].get("cpu_model", "")
    ax.set_title(f"speculative decoding, {report['config']['model']} ({cpu})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
