"""One decoder layer's small ops, the plain forms against the ones the model now runs.

    .venv/bin/python -m pagedserve.ops.microbench.layer_ops_ab [--dtypes float32 bfloat16]
        [--tokens 1 64 512] [--repeats 200] [--out FILE.json]

- rotary: `apply_rotary` on q and on k (two calls, each a concatenated copy) against one
  `apply_rotary_` in place over q and k side by side in the fused q/k/v output;
- RMSNorm, twice per layer: the op-by-op form the model runs against one `F.rms_norm` call (the
  same bits in float32; measured no faster, so not taken: "now" is the candidate here).

SmolLM2-135M's shapes (hidden 576, 9 query and 3 KV heads of 64). The variants alternate, `--repeats`
times each, in one process; medians in microseconds per layer and, x30, per step.
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
from pagedserve.ops.microbench.ab_report import measured, write_report
from pagedserve.services.worker.models.rope import apply_rotary, apply_rotary_

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, LAYERS = 576, 9, 3, 64, 30


def _plain_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def cases(tokens: int, dtype: torch.dtype) -> dict[str, dict[str, Callable[[], object]]]:
    q_size, kv_size = Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    qkv = torch.randn(tokens, q_size + 2 * kv_size).to(dtype)
    freqs = torch.arange(tokens)[:, None].float() * torch.rand(HEAD_DIM // 2)[None, :]
    cos, sin = freqs.cos().to(dtype)[:, None, :], freqs.sin().to(dtype)[:, None, :]

    def rotary_plain() -> object:
        q, k, _v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        return (
            apply_rotary(q.view(tokens, Q_HEADS, HEAD_DIM), cos, sin),
            apply_rotary(k.view(tokens, KV_HEADS, HEAD_DIM), cos, sin),
        )

    def rotary_in_place() -> object:
        # Rotating the same buffer over and over changes its values, not the work done.
        qk = qkv[:, : q_size + kv_size].view(tokens, Q_HEADS + KV_HEADS, HEAD_DIM)
        return apply_rotary_(qk, cos, sin)

    x = torch.randn(tokens, HIDDEN).to(dtype)
    weight = torch.ones(HIDDEN).to(dtype)

    def fused_norm() -> torch.Tensor:
        if dtype == torch.float32:
            return F.rms_norm(x, (HIDDEN,), weight, 1e-5)
        return weight * F.rms_norm(x.float(), (HIDDEN,), None, 1e-5).to(dtype)

    return {
        "rotary (q and k)": {"plain": rotary_plain, "now": rotary_in_place},
        "2x RMSNorm": {
            "plain": lambda: (_plain_rms_norm(x, weight, 1e-5), _plain_rms_norm(x, weight, 1e-5)),
            "now": lambda: (fused_norm(), fused_norm()),
        },
    }


def measure(dtype_name: str, tokens: int, repeats: int) -> list[dict[str, object]]:
    rows = []
    for op, fns in cases(tokens, getattr(torch, dtype_name)).items():
        times: dict[str, list[float]] = {name: [] for name in fns}
        for fn in fns.values():
            fn()
        for _ in range(repeats):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        plain, now = (statistics.median(times[n]) * 1e6 for n in ("plain", "now"))
        row = {
            "dtype": dtype_name,
            "tokens": tokens,
            "op": op,
            "plain_us_per_layer": round(plain, 1),
            "now_us_per_layer": round(now, 1),
            "saved_ms_per_step": round((plain - now) * LAYERS / 1e3, 3),
            "speedup": round(plain / now, 3),
            "load_average": os.getloadavg()[0],
        }
        print(
            f"{dtype_name:>9} T={tokens:4d} {op:17s} plain {plain:8.1f} us  now {now:8.1f} us  "
            f"{row['speedup']:.2f}x  saves {row['saved_ms_per_step']:.2f} ms/step  (load {row['load_average']:.2f})",
            flush=True,
        )
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 64, 512])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        report = measured(
            lambda: [r for d in args.dtypes for t in args.tokens for r in measure(d, t, args.repeats)],
            threads=args.threads,
            repeats=args.repeats,
        )
    write_report(args.out, report)


if __name__ == "__main__":
    main()
