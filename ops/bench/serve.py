"""`pagedserve bench serve`: online serving figures of any OpenAI-compatible server, over HTTP.

    pagedserve bench serve                                    # ours at http://127.0.0.1:8000/v1, all at once
    pagedserve bench serve --request-rate 1,4,inf --max-concurrency 32 --out bench/results/serve.json
    pagedserve bench serve --base-url http://127.0.0.1:8001/v1 --workload bench   # another server

Workloads (seeded, prompts of random token ids, EOS ignored so every output has its length):
`random` = --num-prompts prompts of --input-len tokens, each generating --output-len (vllm bench
serve's random dataset: 64 x 128/128 by default); `bench` = `pagedserve bench`'s workload (lengths
uniform in --min-len..--max-len). Each rate draws prompts of its own (seeds seed, seed + 1, ...: no
rate finds the last one's prompts in a prefix cache), and a peer gets the same ones. Reports request
and output throughput and mean / p50 / p90 / p99 of TTFT, TPOT, inter-token latency and end-to-end
latency per rate; writes JSON and a PNG beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from pagedserve.ops.bench.serve_load import LoadSpec, run_load
from pagedserve.ops.bench.serve_stats import summarize
from pagedserve.ops.bench.workload import make_workload
from pagedserve.ops.results import write_json


def _rates(text: str) -> list[float]:
    try:
        rates = [math.inf if x.strip() == "inf" else float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--request-rate takes numbers or inf, comma-separated; got {text!r}"
        ) from None
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError(f"--request-rate values must be > 0 (or inf); got {text!r}")
    return rates


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="pagedserve bench serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="an OpenAI-compatible /v1 URL")
    ap.add_argument("--model", default=None, help="model name to ask for (default: the server's first)")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="Bearer token, if needed")
    ap.add_argument("--request-rate", type=_rates, default=[math.inf], help="requests/s, e.g. 1,4,inf")
    ap.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    ap.add_argument("--workload", choices=["random", "bench"], default="random")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128, help="random: prompt tokens")
    ap.add_argument("--output-len", type=int, default=128, help="random: output tokens")
    ap.add_argument("--min-len", type=int, default=16, help="bench: shortest prompt and output")
    ap.add_argument("--max-len", type=int, default=256, help="bench: longest prompt and output")
    ap.add_argument(
        "--vocab-size", type=int, default=None, help="token ids are drawn below it (default: the model's)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default=None, help="what is measured, for the report (server, model, load)")
    ap.add_argument(
        "--out", type=Path, default=Path("bench/results/serve.json"), help="JSON; the PNG goes beside"
    )
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument(
        "--warmups",
        type=int,
        default=1,
        help="untimed requests each server answers first (an 8-token prompt no timed one starts with, 4 "
        "tokens out): a server's first request pays for what it sets up lazily (vLLM's bench warms up too)",
    )
    ap.add_argument(
        "--peer-llamacpp",
        action="store_true",
        help="then start llama.cpp's server (llama-server from LLAMACPP_VENV, else llama_cpp.server) on the "
        "served model's GGUF and run the same load against it (ops/bench/llamacpp_server.py)",
    )
    ap.add_argument("--llamacpp-port", type=int, default=8012)
    ap.add_argument(
        "--llamacpp-parallel",
        type=int,
        default=64,
        help="llama-server's slots at most (it gets as many as the load has requests in flight, up to this)",
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp's threads")
    args = ap.parse_args(argv)
    if args.max_concurrency is not None and args.max_concurrency < 1:
        ap.error("--max-concurrency must be >= 1")
    if args.num_prompts < 1:
        ap.error("--num-prompts must be >= 1")
    if args.warmups < 0:
        ap.error("--warmups must be >= 0")
    return args


def _server_model(base_url: str, api_key: str | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    reply = httpx.get(f"{base_url}/models", headers=headers, timeout=10)
    reply.raise_for_status()
    return reply.json()["data"][0]


def _vocab_size(entry: dict[str, Any]) -> int:
    """A local server's model folder or GGUF says (pagedserve and vLLM list it as `root`)."""
    root = Path(str(entry.get("root", "")))
    if root.suffix == ".gguf" and root.is_file():
        from pagedserve.services.checkpoint import read_checkpoint

        return read_checkpoint(root).vocab_size
    config = root / "config.json"
    if config.is_file():
        hf = json.loads(config.read_text())
        return int(hf.get("text_config", hf)["vocab_size"])
    raise SystemExit(f"bench serve: cannot tell the vocabulary of {entry.get('id')!r}; pass --vocab-size")


def workload(
    args: argparse.Namespace, vocab_size: int, seed: int | None = None
) -> tuple[list[list[int]], list[int]]:
    seed = args.seed if seed is None else seed
    if args.workload == "bench":
        w = make_workload(args.num_prompts, vocab_size, seed=seed, min_len=args.min_len, max_len=args.max_len)
        return w.prompts, w.output_lens
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab_size) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    return prompts, [args.output_len] * args.num_prompts


Workloads = list[tuple[list[list[int]], list[int]]]
WARMUP_PROMPT_LEN = 8  # under a block: a warm-up is never a prefix-cache hit for the workload
WARMUP_OUTPUT_LEN = 4


def rate_workloads(args: argparse.Namespace, vocab_size: int) -> Workloads:
    """One workload per --request-rate, the i-th seeded --seed + i: fresh prompts at every rate. With
    one prompt set for all rates, a server's prefix cache (our block manager's, llama-server's slots,
    which keep each slot's last prompt and pick the slot sharing the longest prefix) serves a later
    rate's prompts from the KV an earlier rate left behind: no prefill, and a figure of a cache hit.
    Every server of one invocation gets the same prompts at the same rate."""
    return [workload(args, vocab_size, args.seed + i) for i in range(len(args.request_rate))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        entry = _server_model(args.base_url, args.api_key)
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        print(f"bench serve: no model list at {args.base_url}/models: {exc}", file=sys.stderr)
        return 2
    model = args.model or entry["id"]
    workloads = rate_workloads(args, args.vocab_size or _vocab_size(entry))
    load_at_start = list(os.getloadavg())
    runs = run_rates(args, args.base_url, model, workloads)
    report = {
        "label": args.label,
        "base_url": args.base_url,
        "model": model,
        "workload": {
            "kind": args.workload,
            "num_prompts": args.num_prompts,
            # per rate, in the order of "runs": rate i draws its prompts with seed + i
            "input_tokens": [sum(len(p) for p in prompts) for prompts, _ in workloads],
            "output_tokens": [sum(lens) for _, lens in workloads],
            "seed": args.seed,
            **(
                {"input_len": args.input_len, "output_len": args.output_len}
                if args.workload == "random"
                else {}
            ),
            **({"min_len": args.min_len, "max_len": args.max_len} if args.workload == "bench" else {}),
        },
        "max_concurrency": args.max_concurrency,
        "warmups": args.warmups,  # untimed requests before the load, on every server
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": list(os.getloadavg()),
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
    }
    if args.peer_llamacpp:
        from pagedserve.ops.bench.llamacpp_server import compare, write_compare_chart

        report["llamacpp"] = run_llamacpp_server(args, entry, workloads)
        report["comparison"] = compare(report, report["llamacpp"])
        runs = runs + report["llamacpp"]["runs"]
        chart = args.out.with_name(args.out.stem + "-vs-llamacpp.png")
        write_compare_chart(report["comparison"], f"bench serve: {args.label or model} vs llama.cpp", chart)
        print(json.dumps(report["comparison"], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    png = args.out.with_suffix(".png")
    write_chart(report, png)
    print(f"wrote {args.out} and {png}")
    return 0 if all(r["failed"] == 0 for r in runs) else 1


def run_rates(
    args: argparse.Namespace,
    base_url: str,
    model: str,
    workloads: Workloads,
    extra_for: Callable[[list[list[int]]], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The load at every --request-rate against one server, rate i with workloads[i] -> a summary per
    rate. extra_for(prompts): LoadSpec fields a text-only server needs for those prompts."""
    if args.warmups:
        # The first prompt backwards: its tokens, but the start of no timed prompt (no prefix-cache hit).
        warm = [workloads[0][0][0][::-1][:WARMUP_PROMPT_LEN]] * args.warmups
        spec = LoadSpec(base_url, model, warm, [WARMUP_OUTPUT_LEN] * len(warm), math.inf, 1, args.seed,
                        args.api_key, **(extra_for(warm) if extra_for else {}))  # fmt: skip
        records, _ = asyncio.run(run_load(spec))
        if failed := [r for r in records if r.error]:
            raise SystemExit(f"bench serve: a warm-up request to {base_url} failed: {failed[0].error}")
    runs = []
    for rate, (prompts, output_lens) in zip(args.request_rate, workloads, strict=True):
        spec = LoadSpec(
            base_url,
            model,
            prompts,
            output_lens,
            rate,
            args.max_concurrency,
            args.seed,
            args.api_key,
            **(extra_for(prompts) if extra_for else {}),
        )
        bar = tqdm(
            total=len(prompts), desc=f"rate {rate:g}/s", unit="req", disable=args.no_progress, file=sys.stderr
        )
        records, duration = asyncio.run(run_load(spec, on_done=lambda _, bar=bar: bar.update(1)))
        bar.close()
        summary = {"request_rate": "inf" if math.isinf(rate) else rate, **summarize(records, duration)}
        runs.append(summary)
        print(format_run(summary))
    return runs


def run_llamacpp_server(
    args: argparse.Namespace, entry: dict[str, Any], workloads: Workloads
) -> dict[str, Any]:
    """llama.cpp's server on the served model folder's GGUF, the same load -> its runs and how it ran."""
    from pagedserve.ops.bench.llamacpp_server import (
        llama_server_argv,
        llama_server_binary,
        llamacpp_venv,
        llamacpp_venv_ready,
        request_extras,
        running_server,
        server_argv,
    )
    from pagedserve.services.checkpoint import load_tokenizer, read_checkpoint
    from pagedserve.services.worker.weights.gguf_weights import gguf_source

    folder = Path(str(entry.get("root", "")))  # a checkpoint folder, or the GGUF itself
    gguf = gguf_source(folder) if folder.suffix == ".gguf" or (folder / "config.json").is_file() else None
    if gguf is None:
        raise SystemExit(
            f"bench serve --peer-llamacpp: the served model {entry.get('id')!r} has no GGUF file"
        )
    venv = llamacpp_venv()
    if not llamacpp_venv_ready(venv):
        raise SystemExit(
            f"bench serve --peer-llamacpp: no finished llama.cpp venv at {venv} (ops/peers/setup_llamacpp.sh)"
        )
    longest = max(len(p) + n for prompts, lens in workloads for p, n in zip(prompts, lens, strict=True))
    base_url = f"http://127.0.0.1:{args.llamacpp_port}/v1"
    binary = llama_server_binary(venv)
    extra_for = None
    if binary is not None:
        # Slots for every request the load can have in flight, each with room for the longest.
        parallel = min(args.max_concurrency or args.num_prompts, args.llamacpp_parallel)
        slot_ctx = -(-(longest + 16) // 256) * 256
        argv = llama_server_argv(binary, gguf, args.llamacpp_port, args.threads, slot_ctx, parallel)
        server = {"server": "llama-server", "parallel": parallel, "slot_ctx": slot_ctx}
    else:
        checkpoint = read_checkpoint(folder)
        tokenizer = load_tokenizer(checkpoint.tokenizer_path)
        extra_body = request_extras(list(checkpoint.eos_token_ids))

        def extra_for(prompts: list[list[int]]) -> dict[str, Any]:
            # It takes text only; re-tokenized, lengths shift a little.
            return {"prompt_texts": [tokenizer.decode(p) for p in prompts], "extra_body": extra_body}

        n_ctx = max(-(-longest * 2 // 256) * 256, 2048)
        argv = server_argv(venv / "bin" / "python", gguf, args.llamacpp_port, args.threads, n_ctx)
        server = {"server": "llama_cpp.server", "parallel": 1}
    print(
        f"bench serve: peer {server['server']} ({server['parallel']} at once) on {gguf.name}", file=sys.stderr
    )
    with running_server(argv, base_url, args.out.with_name(args.out.stem + "-llamacpp-server.log")):
        peer_model = _server_model(base_url, None)["id"]
        runs = run_rates(args, base_url, peer_model, workloads, extra_for)
    return {"argv": argv, "gguf": gguf.name, "base_url": base_url, **server, "runs": runs}


def format_run(run: dict[str, Any]) -> str:
    def row(name: str, key: str) -> str:
        d = run[key]
        cells = "  ".join(f"{k} {v:>9.1f}" if v is not None else f"{k} {'-':>9}" for k, v in d.items())
        return f"  {name:<18} {cells}"

    return "\n".join(
        [
            f"rate {run['request_rate']}/s: {run['completed']} done, {run['failed']} failed in {run['duration_s']:.1f} s",
            f"  request throughput {run['request_throughput']} req/s   output {run['output_throughput']} tok/s",
            row("TTFT (ms)", "ttft_ms"),
            row("TPOT (ms)", "tpot_ms"),
            row("ITL (ms)", "itl_ms"),
            row("E2E (ms)", "e2e_ms"),
            *(f"  error: {e}" for e in run["errors"]),
        ]
    )


def write_chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    labels = [str(r["request_rate"]) for r in runs]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = [
        ("output tok/s", [[r["output_throughput"] or 0 for r in runs]], ["output"]),
        ("TTFT ms", [[r["ttft_ms"][p] or 0 for r in runs] for p in ("p50", "p99")], ["p50", "p99"]),
        ("TPOT ms", [[r["tpot_ms"][p] or 0 for r in runs] for p in ("p50", "p99")], ["p50", "p99"]),
        ("ITL ms", [[r["itl_ms"][p] or 0 for r in runs] for p in ("p50", "p99")], ["p50", "p99"]),
    ]
    for ax, (title, series, names) in zip(axes.flat, panels, strict=True):
        width = 0.8 / len(series)
        for i, (values, name) in enumerate(zip(series, names, strict=True)):
            ax.bar([x + i * width for x in range(len(runs))], values, width, label=name)
        ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(runs))], labels)
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(title)
        if len(series) > 1:
            ax.legend()
    fig.suptitle(f"bench serve: {report['label'] or report['model']} ({report['workload']['kind']} workload)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
