"""A model's linears for one step on quantized weights: our GGUF kernel against the alternatives, at
each row count, and each GGUF type against the others.

    .venv/bin/python -m pagedserve.ops.microbench.quant_linear_ab [--rows 1 4 8 64] [--repeats 10]
        [--threads 2] [--isa avx512 avx2 portable] [--modes float int] [--variants gguf fp32]
        [--types Q4_1 Q4_K Q6_K ...] [--layers N] [--layouts stored interleaved] [--json FILE]

Without --types: SmolLM2-135M's shapes (30 layers of q/k/v, o, gate/up, down at Q4_1, the tied LM head
at Q8_0, as the bundled GGUF stores them). With --types: TinyLlama-1.1B's layer shapes (hidden 2048,
intermediate 5632, 4 KV heads of 64; every row a whole number of 256-weight super-blocks, which
SmolLM2's 576 is not), --layers of them (default 4), every linear in one type, one variant per type
(gguf-Q4_K...). Weights are random blocks with small scales: speed does not depend on the values.
Variants, run alternately in one process:
  gguf       quant_linear.cpp on the GGUF blocks (what the worker runs); with several --isa paths,
             one variant per path (gguf-avx512, gguf-avx2...), so the paths are compared in one process;
             with several --modes (float int8 int int-novnni tiles panels), one per mode too
             (gguf-avx512-int...); with --layouts interleaved, the types that have one (Q4_0, Q4_1, Q5_0,
             Q8_0, Q4_K, Q5_K, Q6_K) in the kernel's layout of 8 interleaved rows, one variant per layout
             (gguf-...-interleaved: the avx2 path's int8 tiles; elsewhere read back through the stored
             blocks, as the worker never does)
  fp32       oneDNN's packed float32 GEMM on dense weights of the same shapes (a float32 load)
  int8pack   torch's _weight_int8pack_mm (int8, one scale per output row) after a repack
  int4pack   torch's _weight_int4pack_mm_for_cpu (4-bit, groups of 32) after a repack
Prints ms per step (the minimum and median of the repeats) for each; --json also writes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import gguf
import numpy as np
import torch

from pagedserve.kernels.cpu.build import QUANT_LINEAR, load_extension
from pagedserve.kernels.cpu.isa import cpu_model
from pagedserve.services.worker.layers.packed_linear import PackedLinear

# quant_linear's `mode`: float32 activations (the default: tiles below the kernel's panel threshold,
# panels from it), int8 activations from the kernel's row threshold, int8 activations at every row
# count (VNNI where the CPU has it), the same without VNNI, float32 tiles and float32 panels at every
# row count.
MODES = {"float": 0, "int8": 1, "int": 2, "int-novnni": 3, "tiles": 4, "panels": 5}
Q = gguf.GGMLQuantizationType
# Byte offsets of each type's fp16 fields (scales, mins) within a block: set to small values, so that no
# random byte pair reads as an infinity or a NaN.
FP16_FIELDS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.IQ4_NL: (0,),
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.IQ4_XS: (0,),
}  # fmt: skip
Shape = tuple[int, int, Q]  # (out features, in features, type)


def smollm2_shapes() -> list[Shape]:
    hidden, inter, qkv, vocab, layers = 576, 1536, 960, 49152, 30
    layer = [(qkv, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)]
    return [(n, k, Q.Q4_1) for _ in range(layers) for n, k in layer] + [(vocab, hidden, Q.Q8_0)]


def tinyllama_shapes(kind: Q, layers: int) -> list[Shape]:
    hidden, inter, kv = 2048, 5632, 256
    layer = [(hidden + 2 * kv, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)]
    return [(n, k, kind) for _ in range(layers) for n, k in layer]


def random_blocks(rng: np.random.Generator, n: int, k: int, kind: Q) -> torch.Tensor:
    if kind in (Q.F16, Q.BF16):
        dense = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        return torch.from_numpy(gguf.quants.quantize(dense, kind).view(np.uint8).reshape(n, -1))
    block, block_bytes = gguf.constants.GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, size=(n, k // block, block_bytes), dtype=np.uint8)
    for offset in FP16_FIELDS[kind]:
        scale = (rng.random((n, k // block)) * 0.01).astype(np.float16)
        blocks[..., offset : offset + 2] = scale.view(np.uint8).reshape(n, k // block, 2)
    return torch.from_numpy(blocks.reshape(n, -1))


# the types the kernel interleaves (100 + type)
INTERLEAVED = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K}


def in_layout(ops, layout: str, blocks: torch.Tensor, kind: int) -> tuple[torch.Tensor, int]:
    """(blocks, type id) as stored, or with every 8 rows interleaved where the type has that layout."""
    if layout == "stored" or Q(kind) not in INTERLEAVED or blocks.shape[0] % 8:
        return blocks, kind
    return ops.interleave_rows(blocks, kind), 100 + kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 64])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--isa", nargs="+", default=["avx2"])
    parser.add_argument("--modes", nargs="+", default=["float"], choices=list(MODES))
    parser.add_argument("--variants", nargs="+", default=["gguf", "fp32", "int8pack", "int4pack"])
    parser.add_argument("--types", nargs="+", choices=[t.name for t in FP16_FIELDS] + ["F16", "BF16"])
    parser.add_argument("--layers", type=int, default=4, help="with --types: TinyLlama layers per step")
    parser.add_argument("--layouts", nargs="+", default=["stored"], choices=["stored", "interleaved"])
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    paths = {isa: load_extension(QUANT_LINEAR, isa) for isa in args.isa}
    # One model per type: the bundled model's types, or each --types type throughout.
    models = (
        {t: tinyllama_shapes(Q[t], args.layers) for t in args.types} if args.types else {"": smollm2_shapes()}
    )
    rng = np.random.default_rng(0)
    blocks = {s: random_blocks(rng, *s) for shapes in models.values() for s in set(shapes)}
    dense = {(n, k): torch.randn(n, k) * 0.05 for shapes in models.values() for n, k, _ in shapes}
    any_shapes = next(iter(models.values()))
    steps = {}
    if "gguf" in args.variants:
        for label, shapes in models.items():
            for isa, ops in paths.items():
                for layout in args.layouts:
                    ws = [(s[1], *in_layout(ops, layout, blocks[s], int(s[2]))) for s in shapes]
                    for mode in args.modes:
                        parts = [
                            "gguf",
                            label,
                            isa if len(paths) > 1 else "",
                            mode if len(args.modes) > 1 else "",
                            layout if len(args.layouts) > 1 else "",
                        ]
                        steps["-".join(p for p in parts if p)] = lambda xs, ws=ws, ops=ops, m=MODES[mode]: [
                            ops.quant_linear(xs[k], q, t, None, m) for k, q, t in ws
                        ]
    if "fp32" in args.variants:
        packed = {nk: PackedLinear(w, None) for nk, w in dense.items()}
        ws = [(k, packed[(n, k)]) for n, k, _ in any_shapes]
        steps["fp32"] = lambda xs, ws=ws: [p(xs[k]) for k, p in ws]
    if "int8pack" in args.variants:
        int8 = {}
        for nk, w in dense.items():
            scale = w.abs().amax(1) / 127
            int8[nk] = ((w / scale[:, None]).round().to(torch.int8), scale)
        ws = [(k, *int8[(n, k)]) for n, k, _ in any_shapes]
        steps["int8pack"] = lambda xs, ws=ws: [
            torch.ops.aten._weight_int8pack_mm(xs[k], w, c) for k, w, c in ws
        ]
    if "int4pack" in args.variants:
        int4 = {}
        for (n, k), w in dense.items():
            groups = w.view(n, k // 32, 32)
            lo, hi = groups.amin(-1), groups.amax(-1)
            scale = ((hi - lo) / 15).clamp(min=1e-8)
            codes = (
                ((groups - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).view(n, k)
            )
            packed_codes = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
            # scale_and_zeros [K/32, N, 2]: w = (code - 8) * scale + zero, so zero = lo + 8 scale
            sz = torch.stack([scale, lo + 8 * scale], -1).transpose(0, 1).contiguous()
            int4[(n, k)] = (packed_codes, sz)
        ws = [(k, *int4[(n, k)]) for n, k, _ in any_shapes]
        steps["int4pack"] = lambda xs, ws=ws: [
            torch.ops.aten._weight_int4pack_mm_for_cpu(xs[k], w, 32, sz) for k, w, sz in ws
        ]
    header = f"{cpu_model()}; threads={args.threads} isa={' '.join(args.isa)}"
    model = f"TinyLlama-1.1B layers x{args.layers}" if args.types else "SmolLM2-135M (Q4_1, Q8_0 head)"
    print(f"{header}; {model}; ms per step (min / median of {args.repeats})")
    results = []
    for rows in args.rows:
        xs = {k: torch.randn(rows, k) for k in {s[1] for shapes in models.values() for s in shapes}}
        times = {name: [] for name in steps}
        with torch.inference_mode():
            for _ in range(args.repeats):
                for name, step in steps.items():
                    t = time.perf_counter()
                    step(xs)
                    times[name].append((time.perf_counter() - t) * 1e3)
        line = "  ".join(f"{n} {min(v):7.2f} / {statistics.median(v):7.2f}" for n, v in times.items())
        print(f"rows {rows:4d}  {line}")
        results += [
            {
                "rows": rows,
                "variant": n,
                "min_ms": round(min(v), 3),
                "median_ms": round(statistics.median(v), 3),
            }
            for n, v in times.items()
        ]
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cpu": cpu_model(),
                    "setup": f"{header}; {model}",
                    "args": vars(args) | {"json": str(args.json)},
                    "results": results,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
