"""The whole model's linears for one step, `F.linear` on dense weights against the prepacked GEMM.

    .venv/bin/python -m pagedserve.ops.microbench.linears_ab [--dtypes float32 bfloat16]
        [--rows 1 8 32 64 128 512] [--repeats 15] [--out FILE.json]

The weights are SmolLM2-135M's (30 layers of q/k/v, o, gate/up and down, plus the tied LM head),
loaded once per dtype. For each row count (the decode batch, or a prefill chunk's tokens) the two
variants run the same inputs alternately, `--repeats` times each, in one process, so load from
others on the shared cores hits both alike: only the ratio is meant to be read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels.torch_backend import TorchAttentionBackend
from pagedserve.ops.microbench.ab_report import measured, write_report
from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.worker.layers.packed_linear import PackedLinear
from pagedserve.services.worker.weights.loader import load_model


def model_weights(dtype: str) -> list[torch.Tensor]:
    """Every linear weight of one step, in call order, the LM head last."""
    model = load_model(resolve_model("smollm2-135m"), TorchAttentionBackend(), dtype=dtype).model
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    head = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    return [*weights, head]


def step_fns(weights: list[torch.Tensor]) -> dict[str, Callable[[dict[int, torch.Tensor]], None]]:
    packed = [PackedLinear(w, None) for w in weights]

    def dense(inputs: dict[int, torch.Tensor]) -> None:
        for w in weights:
            F.linear(inputs[w.shape[1]], w)

    def prepacked(inputs: dict[int, torch.Tensor]) -> None:
        for p in packed:
            p(inputs[p.in_features])

    return {"F.linear": dense, "prepacked": prepacked}


def measure(dtype: str, rows: list[int], repeats: int) -> list[dict[str, object]]:
    weights = model_weights(dtype)
    fns = step_fns(weights)
    widths = {w.shape[1] for w in weights}
    results = []
    for m in rows:
        inputs = {k: torch.randn(m, k, dtype=weights[0].dtype) for k in widths}
        times: dict[str, list[float]] = {name: [] for name in fns}
        for fn in fns.values():
            fn(inputs)  # warm-up: oneDNN builds its primitive for this shape
        for _ in range(repeats):
            for name, fn in fns.items():  # interleaved
                t0 = time.perf_counter()
                fn(inputs)
                times[name].append(time.perf_counter() - t0)
        dense_ms = statistics.median(times["F.linear"]) * 1e3
        packed_ms = statistics.median(times["prepacked"]) * 1e3
        row = {
            "dtype": dtype,
            "rows": m,
            "f_linear_ms": round(dense_ms, 2),
            "prepacked_ms": round(packed_ms, 2),
            "speedup": round(dense_ms / packed_ms, 3),
            "f_linear_min_ms": round(min(times["F.linear"]) * 1e3, 2),
            "prepacked_min_ms": round(min(times["prepacked"]) * 1e3, 2),
            "load_average": os.getloadavg()[0],
        }
        print(
            f"{dtype:>9} rows {m:5d}: F.linear {dense_ms:8.2f} ms  prepacked {packed_ms:8.2f} ms  "
            f"{row['speedup']:.2f}x  (min {row['f_linear_min_ms']} / {row['prepacked_min_ms']}; "
            f"load {row['load_average']:.2f})",
            flush=True,
        )
        results.append(row)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 8, 32, 64, 128, 512])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        report = measured(
            lambda: [row for dtype in args.dtypes for row in measure(dtype, args.rows, args.repeats)],
            what="whole-model linears of one SmolLM2-135M step (30 layers + tied LM head), median ms",
            threads=args.threads,
            repeats=args.repeats,
        )
    write_report(args.out, report)


if __name__ == "__main__":
    main()
