"""One layer of paged attention: every ISA path of the C++ kernel this CPU runs, its generic
algorithm and the torch backend, on the same inputs in one process.

    .venv/bin/python -m pagedserve.ops.microbench.attention_kernel_ab [--threads 1] [--repeats 20]
        [--block-sizes 16 128] [--out FILE.json]

Shapes are SmolLM2-135M's (9 query heads, 3 KV heads, head_dim 64). Cases: decode batches of 8, 32
and 64 rows with contexts uniform in 16-512 (the bench's spread), and a prefill of 8 sequences of
30-256 tokens; float32 and bfloat16 caches. Blocks are placed at random, as a pool that has served a
while places them. Variants: `paged_attention` of each runnable path (kernels/cpu/isa.py), `generic`
(the online-softmax algorithm the fast path replaces where it applies, `paged_attention_generic` of
the best path) and `torch` (kernels/torch_backend.py: gathers plus SDPA). The variants alternate on
the same inputs; the best of `--repeats` is reported (a shared core only ever adds time), with each
variant's largest difference from the torch backend and the K/V bytes per second of the best path.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pagedserve.kernels.attention import AttentionMetadata
from pagedserve.kernels.cpu.build import PAGED_ATTENTION, load_extension
from pagedserve.kernels.cpu.isa import runnable_isas
from pagedserve.kernels.paged_reference import PagedBatch, make_paged_batch
from pagedserve.kernels.torch_backend import TorchAttentionBackend
from pagedserve.ops.microbench.ab_report import measured, write_report

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
Variant = Callable[[PagedBatch, AttentionMetadata, float], torch.Tensor]


def cases(rng: random.Random) -> dict[str, tuple[list[int], list[int]]]:
    found = {}
    for batch in (8, 32, 64):
        seq_lens = [rng.randint(16, 512) for _ in range(batch)]
        found[f"decode {batch} rows, contexts 16-512"] = (seq_lens, [1] * batch)
    prefill = [rng.randint(30, 256) for _ in range(8)]
    found["prefill 8 sequences of 30-256"] = (prefill, list(prefill))
    return found


def kernel_variant(op: Any) -> Variant:
    def run(batch: PagedBatch, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        out = torch.empty_like(batch.query)
        op(
            batch.query,
            batch.k_cache,
            batch.v_cache,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            scale,
            0,  # no window
            0.0,  # no softcap
            out,
        )
        return out

    return run


def variants(extra: dict[str, Any] | None = None) -> dict[str, Variant]:
    """name -> a function of (batch, meta, scale): each runnable path's op, the generic algorithm on the
    best path, `extra` ops (same signature as paged_attention), the torch backend."""
    isas = runnable_isas()
    found = {isa: kernel_variant(load_extension(PAGED_ATTENTION, isa).paged_attention) for isa in isas}
    found["generic"] = kernel_variant(load_extension(PAGED_ATTENTION, isas[0]).paged_attention_generic)
    found.update({name: kernel_variant(op) for name, op in (extra or {}).items()})
    torch_backend = TorchAttentionBackend()
    found["torch"] = lambda batch, meta, scale: torch_backend.forward(
        batch.query, batch.k_cache, batch.v_cache, meta, scale
    )
    return found


def run(repeats: int, block_sizes: list[int], extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    ops = variants(extra)
    best_isa = runnable_isas()[0]
    rows = []
    for name, (seq_lens, query_lens) in cases(random.Random(0)).items():
        for dtype in (torch.float32, torch.bfloat16):
            for block_size in block_sizes:
                batch = make_paged_batch(
                    seq_lens, query_lens, HEADS, KV_HEADS, HEAD_DIM, block_size, dtype, torch.device("cpu"), 1
                )
                meta, scale = batch.metadata(), HEAD_DIM**-0.5
                outs: dict[str, torch.Tensor] = {}
                times: dict[str, list[float]] = {k: [] for k in ops}
                for _ in range(repeats):
                    for k, op in ops.items():  # interleaved: a slow spell of the machine hits all
                        start = time.perf_counter()
                        outs[k] = op(batch, meta, scale)
                        times[k].append((time.perf_counter() - start) * 1e3)
                best = {k: min(v) for k, v in times.items()}
                kv_bytes = 2 * sum(seq_lens) * KV_HEADS * HEAD_DIM * batch.k_cache.element_size()
                row = {
                    "case": name,
                    "dtype": str(dtype).removeprefix("torch."),
                    "block_size": block_size,
                    **{f"{k}_ms": round(v, 3) for k, v in best.items()},
                    "kv_gb_per_s": round(kv_bytes / best[best_isa] / 1e6, 1),
                    **{
                        f"{k}_max_abs_diff": (outs[k].float() - outs["torch"].float()).abs().max().item()
                        for k in ops
                        if k != "torch"
                    },
                }
                rows.append(row)
                cols = "  ".join(f"{k} {best[k]:7.2f}" for k in ops)
                diff = max(row[f"{k}_max_abs_diff"] for k in ops if k != "torch")
                print(
                    f"{name:32s} {row['dtype']:8s} block {block_size:3d} ms: {cols}"
                    f"  | {best_isa} {row['kv_gb_per_s']:5.1f} GB/s K/V, max diff vs torch {diff:.1e}",
                    flush=True,
                )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[16])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    report = measured(
        lambda: run(args.repeats, args.block_sizes),
        threads=args.threads,
        repeats=args.repeats,
        block_sizes=args.block_sizes,
        cpu_isas=list(runnable_isas()),
    )
    write_report(args.out, report)


if __name__ == "__main__":
    main()
