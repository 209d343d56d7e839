"""The bundled model's linears for one step on quantized weights: our GGUF kernel against the
alternatives, at each row count.

    .venv/bin/python -m pagedserve.ops.microbench.quant_linear_ab [--rows 1 4 8 64] [--repeats 10]
        [--threads 2] [--isa avx512 avx2 portable] [--modes float int] [--variants gguf fp32]

SmolLM2-135M's shapes (30 layers of q/k/v, o, gate/up, down at Q4_1, the tied LM head at Q8_0, as
the bundled GGUF stores them) with random weights. Variants, run alternately in one process:
  gguf       quant_linear.cpp on the GGUF blocks (what the worker runs); with several --isa paths,
             one variant per path (gguf-avx512, gguf-avx2...), so the paths are compared in one process;
             with several --modes (float int8 int int-novnni tiles panels), one per mode too
             (gguf-avx512-int...)
  fp32       oneDNN's packed float32 GEMM on the dequantized weights (today's worker)
  int8pack   torch's _weight_int8pack_mm (int8, one scale per output row) after a repack
  int4pack   torch's _weight_int4pack_mm_for_cpu (4-bit, groups of 32) after a repack
Prints ms per step (the minimum and median of the repeats) for each.
"""

from __future__ import annotations

import argparse
import statistics
import time

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
HIDDEN, INTER, QKV, VOCAB, LAYERS = 576, 1536, 960, 49152, 30


def shapes() -> list[tuple[int, int, gguf.GGMLQuantizationType]]:
    layer = [(QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]
    q41 = gguf.GGMLQuantizationType.Q4_1
    return [(n, k, q41) for _ in range(LAYERS) for n, k in layer] + [
        (VOCAB, HIDDEN, gguf.GGMLQuantizationType.Q8_0)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 64])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--isa", nargs="+", default=["avx2"])
    parser.add_argument("--modes", nargs="+", default=["float"], choices=list(MODES))
    parser.add_argument("--variants", nargs="+", default=["gguf", "fp32", "int8pack", "int4pack"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    paths = {isa: load_extension(QUANT_LINEAR, isa) for isa in args.isa}
    rng = np.random.default_rng(0)
    distinct = {}
    for n, k, qt in set(shapes()):
        # Speed does not depend on the values: random blocks with small fp16 scales, random dense weights.
        block, block_bytes = gguf.constants.GGML_QUANT_SIZES[qt]
        blocks = rng.integers(0, 256, size=(n, k // block, block_bytes), dtype=np.uint8)
        scales = (rng.random((n, k // block, 2)) * 0.01).astype(np.float16).view(np.uint8)
        blocks[..., :4] = scales.reshape(n, k // block, 4)
        dense = torch.randn(n, k) * 0.05
        distinct[(n, k, qt)] = (torch.from_numpy(blocks.reshape(n, -1)), dense)
    steps = {}
    if "gguf" in args.variants:
        ws = [(s[1], distinct[s][0], int(s[2])) for s in shapes()]
        for isa, ops in paths.items():
            for mode in args.modes:
                name = (
                    "gguf"
                    + (f"-{isa}" if len(paths) > 1 else "")
                    + (f"-{mode}" if len(args.modes) > 1 else "")
                )
                steps[name] = lambda xs, ws=ws, ops=ops, m=MODES[mode]: [
                    ops.quant_linear(xs[k], q, t, None, m) for k, q, t in ws
                ]
    if "fp32" in args.variants:
        packed = {s: PackedLinear(distinct[s][1], None) for s in distinct}
        ws = [(s[1], packed[s]) for s in shapes()]
        steps["fp32"] = lambda xs, ws=ws: [p(xs[k]) for k, p in ws]
    if "int8pack" in args.variants:
        int8 = {}
        for s, (_, dense) in distinct.items():
            scale = dense.abs().amax(1) / 127
            int8[s] = ((dense / scale[:, None]).round().to(torch.int8), scale)
        ws = [(s[1], *int8[s]) for s in shapes()]
        steps["int8pack"] = lambda xs, ws=ws: [
            torch.ops.aten._weight_int8pack_mm(xs[k], w, c) for k, w, c in ws
        ]
    if "int4pack" in args.variants:
        int4 = {}
        for s, (_, dense) in distinct.items():
            n, k = dense.shape
            groups = dense.view(n, k // 32, 32)
            lo, hi = groups.amin(-1), groups.amax(-1)
            scale = ((hi - lo) / 15).clamp(min=1e-8)
            codes = (
                ((groups - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).view(n, k)
            )
            packed_codes = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
            # scale_and_zeros [K/32, N, 2]: w = (code - 8) * scale + zero, so zero = lo + 8 scale
            sz = torch.stack([scale, lo + 8 * scale], -1).transpose(0, 1).contiguous()
            int4[s] = (packed_codes, sz)
        ws = [(s[1], *int4[s]) for s in shapes()]
        steps["int4pack"] = lambda xs, ws=ws: [
            torch.ops.aten._weight_int4pack_mm_for_cpu(xs[k], w, 32, sz) for k, w, sz in ws
        ]
    print(
        f"{cpu_model()}; threads={args.threads} isa={' '.join(args.isa)}; ms per step (min / median of {args.repeats})"
    )
    for rows in args.rows:
        xs = {k: torch.randn(rows, k) for k in (HIDDEN, INTER)}
        times = {name: [] for name in steps}
        with torch.inference_mode():
            for _ in range(args.repeats):
                for name, step in steps.items():
                    t = time.perf_counter()
                    step(xs)
                    times[name].append((time.perf_counter() - t) * 1e3)
        line = "  ".join(f"{n} {min(v):7.2f} / {statistics.median(v):7.2f}" for n, v in times.items())
        print(f"rows {rows:4d}  {line}")


if __name__ == "__main__":
    main()
