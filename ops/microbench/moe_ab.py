"""One MoE block's forward at decode and prefill row counts: the router, the expert grouping and the
experts' matrix products, with its quantized experts as loaded from a GGUF.

    .venv/bin/python -m pagedserve.ops.microbench.moe_ab [--model FOLDER] [--rows 1 4 16 64 512]
                                                         [--layer 0] [--repeats 30] [--threads 2]
                                                         [--modes float32 int8] [--variants fused grouped]
                                                         [--out FILE.json]

The model defaults to ops/models/random_moe_gguf.py's Q4_0 folder. Per row count: the median (and
minimum) ms of the whole block, of its routing alone, and of the experts alone; and how many experts
the rows hit. `--modes` runs the experts with float32 activations and/or int8 ones (the kernel's
mode, PAGEDSERVE_QUANT_ACTIVATIONS), `--variants` as the one C++ op (kernels/cpu/moe_experts.cpp) and/or
in torch ops (layers/moe.py's `grouped`), side by side, interleaved call by call so that a shared
machine's load moves them alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pagedserve.ops.results import write_json
from pagedserve.services.worker.layers.moe import QuantExpertLinear, SparseMoeBlock
from pagedserve.services.worker.layers.quant_linear import ACTIVATION_MODES


def _time(fn: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    from pagedserve.kernels.torch_backend import TorchAttentionBackend
    from pagedserve.services.worker.weights.bundled import cache_root
    from pagedserve.services.worker.weights.loader import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=cache_root() / "random-moe-1b-q4_0")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 512])
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--modes", nargs="+", choices=sorted(ACTIVATION_MODES), default=["float32"])
    ap.add_argument("--variants", nargs="+", choices=["fused", "grouped"], default=["fused", "grouped"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(args.model, TorchAttentionBackend(), quantization="gguf").model
    model.prepack_weights()
    block = model.layers[args.layer].mlp
    if not isinstance(block, SparseMoeBlock):
        raise SystemExit(f"layer {args.layer} of {args.model} has no MoE block")
    experts = block.experts
    kinds = {
        type(m).__name__: getattr(m, "weight_type", "dense")
        for m in (experts.gate_up_proj, experts.down_proj)
    }
    print(
        f"{args.model}: layer {args.layer}, experts {kinds}, {args.threads} threads, load {os.getloadavg()}"
    )
    report: dict[str, object] = {
        "model": str(args.model),
        "threads": args.threads,
        "experts": kinds,
        "rows": {},
    }
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in args.rows:
            x = torch.randn(rows, model.config.hidden_size, generator=generator)
            ids, weights = block.route(x)
            timings: dict[str, list[float]] = {"route": []}
            runs = [(mode, variant) for mode in args.modes for variant in args.variants]
            for mode, variant in runs:
                timings[f"block/{variant}/{mode}"], timings[f"experts/{variant}/{mode}"] = [], []
            for _ in range(args.repeats + 2):  # the first two warm up
                timings["route"].append(_time(block.route, x))
                for mode, variant in runs:
                    for m in (experts.gate_up_proj, experts.down_proj):
                        if isinstance(m, QuantExpertLinear):
                            m.mode = ACTIVATION_MODES[mode]
                    experts.fused = variant == "fused"
                    timings[f"block/{variant}/{mode}"].append(_time(block, x))
                    timings[f"experts/{variant}/{mode}"].append(_time(experts, x, ids, weights))
            hit = int(torch.unique(ids).numel())
            summary = {
                name: {"median_ms": statistics.median(t[2:]) * 1e3, "min_ms": min(t[2:]) * 1e3}
                for name, t in timings.items()
            }
            report["rows"][rows] = {"experts_hit": hit, **summary}  # type: ignore[index]
            cells = "  ".join(f"{n} {s['median_ms']:.3f} ({s['min_ms']:.3f})" for n, s in summary.items())
            print(f"rows {rows:4d}, {hit:2d} experts hit: {cells}  [median (min) ms]")
    report["load_average_at_end"] = os.getloadavg()
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()
