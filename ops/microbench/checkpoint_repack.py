"""How long the load-time repack of GPTQ / AWQ / compressed-tensors int4 linears into Q4_1 blocks takes.

    .venv/bin/python -m pagedserve.ops.microbench.checkpoint_repack [--repeats 3] [--group-size 64]

The linears of a SmolLM2-135M-shaped model (30 layers; q/o 576x576, k/v 192x576, gate/up 1536x576,
down 576x1536: 106M weights) as random stored tensors of each format, asymmetric (so Q4_1, the most
work), through read_linear + kernel_type + to_blocks: the repack core alone, not the file reads or
the install's row concatenation. Prints the minimum over --repeats per format, and every repeat.
The loader runs the repack on one torch thread: OMP_NUM_THREADS=1 measures what it does.
"""

from __future__ import annotations

import argparse
import time

import torch

from pagedserve.services.worker.weights.checkpoint_quant import Scheme, kernel_type, read_linear, to_blocks

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30


def _words(*shape: int) -> torch.Tensor:
    return torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32)


def stored(scheme: Scheme, out: int, k: int) -> dict[str, torch.Tensor]:
    groups = k // scheme.group_size
    scales = torch.rand(groups, out) * 0.01 + 0.001
    if scheme.method == "gptq":
        return {
            "qweight": _words(k // 8, out),
            "qzeros": _words(groups, out // 8),
            "scales": scales.half(),
            "g_idx": (torch.arange(k) // scheme.group_size).int(),
        }
    if scheme.method == "awq":
        return {"qweight": _words(k, out // 8), "qzeros": _words(groups, out // 8), "scales": scales.half()}
    return {
        "weight_packed": _words(out, k // 8),
        "weight_scale": scales.T.contiguous().bfloat16(),
        "weight_zero_point": _words(out // 8, groups),
        "weight_shape": torch.tensor([out, k]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    for method, layout in (("gptq", "gptq"), ("awq", "gemm"), ("compressed-tensors", "pack-quantized")):
        scheme = Scheme(method, 4, args.group_size, layout)
        tensors = [stored(scheme, out, k) for out, k in SHAPES]
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for t in tensors:
                weight = read_linear(scheme, t, "bench")
                type_name, why = kernel_type(weight)
                assert type_name == "Q4_1", why
                to_blocks(weight, type_name, method)
            times.append(time.perf_counter() - start)
        weights = sum(out * k for out, k in SHAPES)
        print(
            f"{method:20s} {weights / 1e6:.0f}M weights -> Q4_1 in {min(times):.2f} s "
            f"(min of {args.repeats}; all: {' '.join(f'{t:.2f}' for t in times)}; {torch.get_num_threads()} threads)"
        )


if __name__ == "__main__":
    main()
