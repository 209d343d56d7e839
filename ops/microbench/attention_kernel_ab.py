"""One layer of paged attention: the C++ kernel's AVX-512 path against its generic path, in one process.

    .venv/bin/python -m pagedserve.ops.microbench.attention_kernel_ab [--threads 1] [--repeats 30]
        [--out FILE.json]

Shapes are SmolLM2-135M's (9 query heads, 3 KV heads, head_dim 64). Cases: a decode batch of 64
rows with contexts 16-512 (the bench's spread), the same in cache (4 rows of 264), and a prefill of 8
sequences of 30-256 tokens; block sizes 16 and 128; float32 and bfloat16 caches. Blocks are placed at
random, as a pool that has served a while places them. The two paths alternate on the same inputs;
the best of `--repeats` is reported (a shared core only ever adds time), with the largest difference
between their outputs and the K/V bytes read per second by the AVX-512 path.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

import torch
from pagedserve.kernels.cpu.build import load_paged_attention
from pagedserve.kernels.paged_reference import make_paged_batch
from pagedserve.ops.microbench.ab_report import measured, write_report

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def cases(rng: random.Random) -> dict[str, tuple[list[int], list[int]]]:
    decode = [rng.randint(16, 256) + rng.randint(0, 256) for _ in range(64)]
    prefill = [rng.randint(30, 256) for _ in range(8)]
    return {
        "decode 64 rows, contexts 16-512": (decode, [1] * 64),
        "decode 4 rows of 264 (in cache)": ([264] * 4, [1] * 4),
        "prefill 8 sequences of 30-256": (prefill, list(prefill)),
    }


def timed_ms(op: Any, args: tuple, out: torch.Tensor) -> float:
    start = time.perf_counter()
    op(*args, out)
    return (time.perf_counter() - start) * 1e3


def run(repeats: int) -> list[dict[str, Any]]:
    load_paged_attention()
    ops = {
        "avx512": torch.ops.pagedserve.paged_attention,
        "generic": torch.ops.pagedserve.paged_attention_portable,
    }
    rows = []
    for name, (seq_lens, query_lens) in cases(random.Random(0)).items():
        for dtype in (torch.float32, torch.bfloat16):
            for block_size in (16, 128):
                batch = make_paged_batch(
                    seq_lens, query_lens, HEADS, KV_HEADS, HEAD_DIM, block_size, dtype, torch.device("cpu"), 1
                )
                args = (
                    batch.query.contiguous(),
                    batch.k_cache,
                    batch.v_cache,
                    batch.query_start_loc,
                    batch.seq_lens,
                    batch.block_tables,
                    HEAD_DIM**-0.5,
                )
                outs = {k: torch.empty_like(batch.query) for k in ops}
                times: dict[str, list[float]] = {k: [] for k in ops}
                for _ in range(repeats):
                    for k, op in ops.items():
                        times[k].append(timed_ms(op, args, outs[k]))
                best = {k: min(v) for k, v in times.items()}
                kv_bytes = 2 * sum(seq_lens) * KV_HEADS * HEAD_DIM * batch.k_cache.element_size()
                row = {
                    "case": name,
                    "dtype": str(dtype).removeprefix("torch."),
                    "block_size": block_size,
                    "generic_ms": round(best["generic"], 3),
                    "avx512_ms": round(best["avx512"], 3),
                    "speedup": round(best["generic"] / best["avx512"], 2),
                    "kv_gb_per_s": round(kv_bytes / best["avx512"] / 1e6, 1),
                    "max_abs_diff": (outs["avx512"].float() - outs["generic"].float()).abs().max().item(),
                }
                rows.append(row)
                print(
                    f"{name:34s} {row['dtype']:9s} block {block_size:3d}: generic {row['generic_ms']:7.2f} ms"
                    f"  avx512 {row['avx512_ms']:7.2f} ms  x{row['speedup']:.2f}"
                    f"  {row['kv_gb_per_s']:5.1f} GB/s K/V  diff {row['max_abs_diff']:.1e}"
                )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    report = measured(lambda: run(args.repeats), threads=args.threads, repeats=args.repeats)
    write_report(args.out, report)


if __name__ == "__main__":
    main()
