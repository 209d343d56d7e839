"""In-process tok/s of `LLM.generate` on the bench workload, one engine per attention backend x dtype.

    .venv/bin/python -m pagedserve.ops.microbench.attention_ab [--num-requests 32] [--max-len 128]
        [--backends torch cpp] [--dtypes float32 bfloat16] [--rounds 2] [--out FILE.json]

The torch backend is the path before the C++ kernel (gathered K/V + SDPA): selecting it is how the
old path is measured beside the new one. Rounds are interleaved (every variant once per round) on
engines built once, so load changes on a shared machine hit every variant alike; medians reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from pagedserve.engine.llm import LLM
from pagedserve.ops.bench.workload import make_workload
from pagedserve.ops.results import write_json
from pagedserve.shared.protocol.frontend import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--backends", nargs="+", default=["torch", "cpp"])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    workload = make_workload(args.num_requests, 49152, seed=0, min_len=args.min_len, max_len=args.max_len)
    params = [SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True) for n in workload.output_lens]
    engines = {
        (dtype, backend): LLM(
            "smollm2-135m", dtype=dtype, attention_backend=backend, kv_cache_memory=512 * 1024**2
        )
        for dtype in args.dtypes
        for backend in args.backends
    }
    warm = SamplingParams(max_tokens=4, ignore_eos=True)
    for llm in engines.values():
        llm.generate([[1, 2, 3, 4, 5, 6, 7, 8]], warm, use_tqdm=False)
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in engines}
    for _ in range(args.rounds):
        for key, llm in engines.items():
            t0 = time.perf_counter()
            outputs = llm.generate(workload.prompts, params, use_tqdm=False)
            wall = time.perf_counter() - t0
            rates[key].append(sum(len(o.token_ids) for o in outputs) / wall)
            print(f"{key[0]}/{key[1]}: {rates[key][-1]:.1f} tok/s", flush=True)
    rows = [
        {"dtype": d, "backend": b, "tok_s_median": round(statistics.median(r), 1), "tok_s": r}
        for (d, b), r in rates.items()
    ]
    report = {
        "workload": workload.summary(),
        "threads": args.threads,
        "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg(),
        "rows": rows,
    }
    for row in rows:
        print(
            f"{row['dtype']:>9} {row['backend']:>6}: {row['tok_s_median']:.1f} tok/s (median of {args.rounds})"
        )
    print(f"load average {load_start} at start, {report['load_average_at_end']} at end")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.out, report)


if __name__ == "__main__":
    main()
