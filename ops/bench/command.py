"""`pagedserve bench`: output tokens/s of pagedserve against transformers, on one CPU workload.

    pagedserve bench                    # 64 requests, lengths 16-256, every path (15-25 min on 2 cores)
    pagedserve bench --quick            # 16 requests, lengths 16-64, batch sizes 8 and 16
    pagedserve bench --peers pagedserve,hf-static --hf-batch-sizes 16,32
    pagedserve bench --services --depths 1,2,3   # also through the real processes
    pagedserve bench serve --request-rate 1,4,inf   # online over HTTP, any OpenAI-compatible server
    pagedserve bench fleet              # one scheduler driving 1..32 simulated workers (ops/bench/fleet.py)
    pagedserve bench speculative        # speculative decoding on four workloads at 1, 4, 16 concurrent
    pagedserve bench placement          # cache-aware against round-robin placement over 2 shards

The workload (nano-vllm's bench.py, scaled down): seed 0, prompts of random token ids, prompt and
output lengths uniform in [--min-len, --max-len], EOS ignored, temperature 0.6. The same requests
go through: pagedserve in-process (`LLM.generate`), transformers `generate` in static batches (each
batch size of --hf-batch-sizes; a batch runs to its longest request, but only each request's own
tokens count), and transformers' continuous batching. Targets: >= 2x the best transformers path,
KV utilisation >= 95%. Each path's efficiency is its model FLOP/s over a torch.mm ceiling of the same
dtype measured in the same run (ops/bench/efficiency.py). Writes JSON (--out) and a PNG chart beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from pagedserve.ops.results import write_json
from pagedserve.shared.config import add_config_flag

PEERS = ("pagedserve", "hf-static", "hf-continuous", "vllm", "llamacpp")
# vLLM and llama.cpp need their own venvs (ops/peers/setup_vllm.sh, ops/peers/setup_llamacpp.sh), so
# they run when named or with `--peers all`. llama.cpp reads the checkpoint's GGUF file.
DEFAULT_PEERS = ("pagedserve", "hf-static", "hf-continuous")


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _peer_list(text: str) -> list[str]:
    if text.strip() == "all":
        return list(PEERS)
    peers = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in peers if p not in PEERS]
    if unknown or not peers:
        raise argparse.ArgumentTypeError(f"--peers takes a comma list of {', '.join(PEERS)}; got {text!r}")
    return peers


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="pagedserve bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_flag(ap, "model")
    # The flags that are deployment settings read as the settings do (shared/config.py); the defaults are
    # the bench's own where they differ (every peer gets the same, concrete dtype and pool).
    add_config_flag(ap, "dtype", "float32")
    add_config_flag(ap, "quantization", "none")
    ap.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: all cores)"
    )
    ap.add_argument("--num-requests", type=int, default=None, help="default 64 (16 with --quick)")
    ap.add_argument("--min-len", type=int, default=None, help="shortest prompt and output (default 16)")
    ap.add_argument(
        "--max-len", type=int, default=None, help="longest prompt and output (default 256, 64 quick)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument(
        "--peers",
        type=_peer_list,
        default=list(DEFAULT_PEERS),
        help=f"comma list of {', '.join(PEERS)}, or all",
    )
    ap.add_argument("--hf-batch-sizes", type=_int_list, default=None, help="default 8,16,32,64 (8,16 quick)")
    add_config_flag(
        ap, "kv_cache_memory", "1GiB", help="KV pool of pagedserve and of transformers' continuous batching"
    )
    add_config_flag(ap, "block_size", 16)
    add_config_flag(ap, "max_num_seqs", 64)
    add_config_flag(ap, "max_num_batched_tokens", 2048)
    add_config_flag(ap, "pipeline_depth", 2, help="of the in-process engine")
    ap.add_argument("--services", action="store_true", help="also run through the real services (supervisor)")
    ap.add_argument("--depths", type=_int_list, default=[1, 2, 3], help="pipeline depths for --services")
    ap.add_argument("--quick", action="store_true", help="16 requests, lengths 16-64, batch sizes 8,16")
    ap.add_argument(
        "--emulate-isa",
        choices=["avx2", "portable"],
        default=None,
        help="run every peer as on a CPU without AVX-512 (our kernels, ATen, oneDNN, MKL, vLLM's build)",
    )
    ap.add_argument(
        "--out", type=Path, default=Path("bench/results/bench.json"), help="JSON; the PNG goes beside"
    )
    args = ap.parse_args(argv)
    args.emulated = {}
    if args.emulate_isa:  # before anything imports torch
        from pagedserve.ops.bench.emulation import emulate_isa

        args.emulated = emulate_isa(args.emulate_isa)
    from pagedserve.services.worker.weights.loader import resolve_dtype

    args.dtype = resolve_dtype(args.dtype, "cpu")  # every peer gets the same, concrete dtype
    quick = args.quick
    args.num_requests = args.num_requests or (16 if quick else 64)
    args.min_len = args.min_len or 16
    args.max_len = args.max_len or (64 if quick else 256)
    args.hf_batch_sizes = args.hf_batch_sizes or ([8, 16] if quick else [8, 16, 32, 64])
    if args.services and "pagedserve" not in args.peers:
        args.peers.append("pagedserve")  # the services are measured against the in-process figure
    return args


SUBCOMMANDS = {
    "serve": "pagedserve.ops.bench.serve",  # online, over HTTP, any OpenAI-compatible server
    "front-door": "pagedserve.ops.bench.front_door",  # many HTTP clients through the API
    "speculative": "pagedserve.ops.bench.speculative",  # speculative decoding against none
    "fleet": "pagedserve.ops.bench.fleet",  # simulated workers behind one scheduler or shards
    "placement": "pagedserve.ops.bench.placement",  # the router's placement on a multi-turn workload
}


def main(argv: list[str] | None = None) -> int:
    if argv and argv[0] in SUBCOMMANDS:  # each with its own flags
        import importlib

        return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
    args = parse_args(argv)
    from pagedserve.services.worker.cpu_dtype import UnsupportedDtype, check_cpu_dtype

    try:
        check_cpu_dtype(args.dtype)
    except UnsupportedDtype as e:
        print(f"pagedserve bench: {e}", file=sys.stderr)
        return 2
    import torch

    from pagedserve.ops.bench.efficiency import ceiling_shape, efficiency_json, matmul_ceiling, model_flops
    from pagedserve.ops.bench.peers import (
        BenchSettings,
        PathResult,
        run_hf_continuous,
        run_hf_static,
        run_pagedserve,
    )
    from pagedserve.ops.bench.report import build_report, machine_info, print_report, write_chart
    from pagedserve.ops.bench.workload import make_workload, max_len_utilization
    from pagedserve.services.checkpoint import resolve_model

    torch.set_num_threads(args.threads)
    # Other work on these shared cores moves every number: the load before and after says how much.
    load_at_start = list(os.getloadavg())
    torch.manual_seed(args.seed)
    settings = BenchSettings(
        model_path=resolve_model(args.model),
        dtype=args.dtype,
        block_size=args.block_size,
        kv_cache_memory=args.kv_cache_memory,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        pipeline_depth=args.pipeline_depth,
        temperature=args.temperature,
        seed=args.seed,
        quantization=args.quantization,
    )
    model_config = settings.model_config()
    workload = make_workload(
        args.num_requests, model_config.vocab_size, seed=args.seed, min_len=args.min_len, max_len=args.max_len
    )

    # The matmul ceiling before and after the peers: the machine's speed may change in between.
    ceilings = [matmul_ceiling(args.dtype, ceiling_shape(model_config))]
    paths: list[PathResult] = []
    for peer in PEERS:  # a fixed order: every run reads the same way
        if peer not in args.peers:
            continue
        print(f"bench: running {peer} ...", file=sys.stderr, flush=True)
        if peer == "hf-static":
            paths += run_hf_static(workload, settings, args.hf_batch_sizes)
            continue
        run = run_pagedserve if peer == "pagedserve" else run_hf_continuous
        if peer == "vllm":
            from pagedserve.ops.bench.vllm_run import run_vllm

            run = lambda w, s: run_vllm(w, s, args.threads)  # noqa: E731
        if peer == "llamacpp":
            from pagedserve.ops.bench.llamacpp_run import run_llamacpp

            run = lambda w, s: run_llamacpp(w, s, args.threads)  # noqa: E731
        try:
            paths.append(run(workload, settings))
        except Exception as e:  # a path that cannot run here is reported, not fatal to the others
            paths.append(PathResult(peer, error=f"{type(e).__name__}: {e}"))
        print(f"bench: {peer}: {paths[-1].tokens_per_s:.1f} tok/s {paths[-1].error or ''}", file=sys.stderr)

    services: list[PathResult] = []
    if args.services:
        from pagedserve.ops.bench.services import run_services

        print(f"bench: running services at depths {args.depths} ...", file=sys.stderr, flush=True)
        services = run_services(workload, settings, args.depths, args.threads)

    ceilings.append(matmul_ceiling(args.dtype, ceiling_shape(model_config)))
    report = build_report(
        config=_config_json(args, settings),
        workload=workload.summary(),
        paths=paths,
        services=services,
        max_len_kv={
            "max_model_len": model_config.max_model_len,
            "kv_utilization": max_len_utilization(workload, model_config.max_model_len),
        },
        efficiency=efficiency_json(model_flops(model_config, workload), ceilings),
    )
    report = {"machine": {**machine_info(), "load_average_at_start": load_at_start}, **report}
    print_report(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    png = args.out.with_suffix(".png")
    write_chart(report, png)
    print(f"wrote {args.out} and {png}")
    return 0


def _config_json(args: argparse.Namespace, settings: Any) -> dict[str, Any]:
    return {
        "model": str(args.model),
        "model_path": str(settings.model_path),
        "dtype": args.dtype,
        "quantization": args.quantization,
        "threads": args.threads,
        "seed": args.seed,
        "temperature": args.temperature,
        "min_len": args.min_len,
        "max_len": args.max_len,
        "peers": args.peers,
        "hf_batch_sizes": args.hf_batch_sizes,
        "kv_cache_memory_bytes": settings.kv_cache_memory,
        "num_blocks": settings.num_blocks(),
        "block_size": args.block_size,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "pipeline_depth": args.pipeline_depth,
        "services": args.services,
        "depths": args.depths if args.services else [],
        "quick": args.quick,
        "emulate_isa": args.emulate_isa,
        "emulation_environment": args.emulated,
        **({"emulation_note": _emulation_note(args.emulate_isa)} if args.emulate_isa else {}),
    }


def _emulation_note(isa: str) -> str:
    from pagedserve.ops.bench.emulation import NOTE

    return NOTE.format(isa=isa)


if __name__ == "__main__":
    sys.exit(main())
