"""One decoder layer's small ops, the plain forms against the ones the model now runs.

    .venv/bin/python -m pagedserve.ops.microbench.layer_ops_ab [--dtypes float32 bfloat16]
        [--tokens 1 4 64 512] [--isa avx512 avx2 portable] [--repeats 200] [--out FILE.json]

- rotary: `apply_rotary_` (6 torch ops, in place over q and k side by side in the fused q/k/v
  output) against our C++ `rotary_` (one call, the same bits);
- residual add + RMSNorm, twice per layer: `x + residual` and the op-by-op norm (8 torch ops)
  against one call of our fused C++ `fused_add_rms_norm` (in place);
- SiLU-and-mul: split, `F.silu(gate) * up` (3 ops) against our C++ `silu_and_mul`, on the [T, 2I]
  gate/up output.

`--isa`: which builds of the C++ ops to time, each its own variant beside the torch forms (default:
every path this CPU runs, best first; kernels/cpu/isa.py). SmolLM2-135M's shapes (hidden 576,
intermediate 1536, 9 query and 3 KV heads of 64). The variants alternate, `--repeats` times each, in
one process; the minimum and the median of each in microseconds per layer; `saved_ms_per_step`
(x30 layers) and `speedup` from the medians, each path against the torch forms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pagedserve.kernels.cpu.isa import ISAS, runnable_isas
from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, CppLayerOps
from pagedserve.ops.microbench.ab_report import measured, write_report

HIDDEN, INTERMEDIATE, Q_HEADS, KV_HEADS, HEAD_DIM, LAYERS = 576, 1536, 9, 3, 64, 30


def cases(tokens: int, dtype: torch.dtype, isas: list[str]) -> dict[str, dict[str, Callable[[], object]]]:
    q_size, kv_size = Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    qkv = torch.randn(tokens, q_size + 2 * kv_size).to(dtype)
    freqs = torch.arange(tokens)[:, None].float() * torch.rand(HEAD_DIM // 2)[None, :]
    cos, sin = freqs.cos().to(dtype)[:, None, :], freqs.sin().to(dtype)[:, None, :]

    # Rotating the same buffer over and over changes its values, not the work done.
    qk = qkv.view(tokens, -1, HEAD_DIM)[:, : Q_HEADS + KV_HEADS]
    x, residual = torch.randn(tokens, HIDDEN).to(dtype), torch.randn(tokens, HIDDEN).to(dtype)
    weight = torch.ones(HIDDEN).to(dtype)
    gate_up = torch.randn(tokens, 2 * INTERMEDIATE).to(dtype)
    variants = {"torch": TORCH_LAYER_OPS, **{isa: CppLayerOps(isa) for isa in isas}}

    def add_norm_twice(ops: object) -> object:
        # In place for the C++ op: the residual grows a little each call, the work stays the same.
        return ops.add_rms_norm(x, residual, weight, 1e-5), ops.add_rms_norm(x, residual, weight, 1e-5)

    def each(call: Callable[[object], object]) -> dict[str, Callable[[], object]]:
        return {name: (lambda ops=ops: call(ops)) for name, ops in variants.items()}

    return {
        "rotary (q and k)": each(lambda ops: ops.rotary_(qk, cos, sin)),
        "2x add + RMSNorm": each(add_norm_twice),
        "SiLU-and-mul": each(lambda ops: ops.silu_and_mul(gate_up)),
    }


def measure(dtype_name: str, tokens: int, repeats: int, isas: list[str]) -> list[dict[str, object]]:
    rows = []
    for op, fns in cases(tokens, getattr(torch, dtype_name), isas).items():
        times: dict[str, list[float]] = {name: [] for name in fns}
        for fn in fns.values():
            fn()
        for _ in range(repeats):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        median = {name: statistics.median(t) * 1e6 for name, t in times.items()}
        fastest = {name: min(t) * 1e6 for name, t in times.items()}
        row: dict[str, object] = {"dtype": dtype_name, "tokens": tokens, "op": op}
        for name in fns:
            row[f"{name}_us_per_layer"] = round(median[name], 1)
            row[f"{name}_min_us_per_layer"] = round(fastest[name], 1)
        for isa in isas:
            row[f"{isa}_saved_ms_per_step"] = round((median["torch"] - median[isa]) * LAYERS / 1e3, 3)
            row[f"{isa}_speedup"] = round(median["torch"] / median[isa], 3)
        row["load_average"] = os.getloadavg()[0]
        print(
            f"{dtype_name:>9} T={tokens:4d} {op:18s} "
            + "  ".join(f"{name} {median[name]:7.1f} (min {fastest[name]:7.1f}) us" for name in fns)
            + "".join(f"  {isa} {row[f'{isa}_speedup']:.2f}x" for isa in isas)
            + f"  (load {row['load_average']:.2f})",
            flush=True,
        )
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 4, 64, 512])
    ap.add_argument(
        "--isa", nargs="+", choices=ISAS, default=None, help="C++ paths to time (default: all this CPU runs)"
    )
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    isas = args.isa or list(runnable_isas())
    unrunnable = [isa for isa in isas if isa not in runnable_isas()]
    if unrunnable:
        ap.error(f"this CPU cannot run {', '.join(unrunnable)} (it runs {', '.join(runnable_isas())})")
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        report = measured(
            lambda: [r for d in args.dtypes for t in args.tokens for r in measure(d, t, args.repeats, isas)],
            threads=args.threads,
            isas=isas,
            repeats=args.repeats,
        )
    write_report(args.out, report)


if __name__ == "__main__":
    main()
