"""The LoRA delta alone, the C++ kernel against the masked and grouped torch paths, on one decoder
layer's four LoRA linears
of the bundled model's shapes (SmolLM2-135M: hidden 576, q/k/v 576/192/192, intermediate 1536).

Every slot in use holds a random rank-R adapter on every part; rows are spread evenly over the slots,
each adapter's rows side by side (what the runner's grouping gives). The base linear is left out
(it returns zeros) so only the adapter work is timed. Run alone:

    .venv/bin/python -m pagedserve.ops.microbench.lora_linear_ab [--cases 8:4,64:8] [--threads 2]
    .venv/bin/python -m pagedserve.ops.microbench.lora_linear_ab --stack-dtypes float32 bfloat16 [--layers 30]

With --stack-dtypes: the kernel over `--layers` layers' stacks in each dtype (--lora-dtype), a decode
step's worth of calls, cold as in a step (the stacks of 30 layers outgrow the caches); the dtypes
alternate step by step in one process, so a drift of the machine moves them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from pagedserve.services.worker.layers.lora import LoRABatch, LoRALinear
from pagedserve.services.worker.weights.lora_adapter import PackedLoRA

HIDDEN, INTER = 576, 1536
LINEARS = {  # name -> (in, parts' outs)
    "qkv_proj": (HIDDEN, (576, 192, 192)),
    "o_proj": (HIDDEN, (576,)),
    "gate_up_proj": (HIDDEN, (INTER, INTER)),
    "down_proj": (INTER, (HIDDEN,)),
}


class _NoBase(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], self.out_features)


PATHS = ("cpp", "masked", "grouped")


def layer_linears(
    batch: LoRABatch, rows: int, slots: int, rank: int, dtype: torch.dtype = torch.float32
) -> list[tuple[LoRALinear, torch.Tensor]]:
    """One layer's four LoRA linears, every slot filled, each with its rows of input."""
    linears = []
    for in_features, outs in LINEARS.values():
        parts, start = [], 0
        for out in outs:
            parts.append(slice(start, start + out))
            start += out
        linear = LoRALinear(_NoBase(in_features, start), batch, slots, parts)
        for slot in range(slots):
            packed = tuple(
                (
                    p,
                    (0.02 * torch.randn(rank, in_features)).to(dtype),
                    (0.02 * torch.randn(rank, out)).to(dtype),
                )
                for p, out in enumerate(outs)
            )
            linear.fill(slot, PackedLoRA(packed))
        linears.append((linear, torch.randn(rows, in_features)))
    return linears


def layer_us(rows: int, slots: int, rank: int, path: str, repeat: int = 200) -> float:
    batch = LoRABatch(cpp=path == "cpp")
    linears = layer_linears(batch, rows, slots, rank)
    batch.set_rows([row * slots // rows for row in range(rows)])
    if path == "cpp" and batch.row_slots is None:
        raise SystemExit(f"the C++ LoRA kernel does not take {rows} rows here (CPP_MAX_ROWS, or no build)")
    if path == "grouped":
        batch.mask = None
    elif path == "masked" and batch.mask is None:
        mask = torch.zeros(rows, slots)
        mask[torch.arange(rows), torch.arange(rows) * slots // rows] = 1.0
        batch.mask = mask.view(rows, slots, 1, 1)  # forced past the crossover, for the comparison
    runs = []
    with torch.inference_mode():
        for _ in range(20):
            for linear, x in linears:
                linear(x)
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(repeat):
                for linear, x in linears:
                    linear(x)
            runs.append((time.perf_counter() - started) / repeat * 1e6)
    return statistics.median(runs)


def cold_steps_ms(
    rows: int, slots: int, rank: int, dtypes: list[torch.dtype], layers: int, steps: int = 15
) -> dict[torch.dtype, float]:
    """Median ms of the kernel over `layers` layers' linears (one decode step's LoRA work) per stack dtype."""
    batch = LoRABatch()
    model = {d: [layer_linears(batch, rows, slots, rank, d) for _ in range(layers)] for d in dtypes}
    batch.set_rows([row * slots // rows for row in range(rows)])
    if batch.row_slots is None:
        raise SystemExit(f"the C++ LoRA kernel does not take {rows} rows here (CPP_MAX_ROWS, or no build)")
    times: dict[torch.dtype, list[float]] = {d: [] for d in dtypes}
    with torch.inference_mode():
        for _ in range(steps):
            for dtype, stack in model.items():
                started = time.perf_counter()
                for layer in stack:
                    for linear, x in layer:
                        linear(x)
                times[dtype].append((time.perf_counter() - started) * 1e3)
    return {d: statistics.median(t) for d, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cases", default="8:4,16:4,32:4,16:8,32:8,64:8", help="rows:slots, comma-separated")
    parser.add_argument("--stack-dtypes", nargs="+", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--layers", type=int, default=30, help="with --stack-dtypes (SmolLM2 has 30)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.stack_dtypes:
        dtypes = [getattr(torch, d) for d in args.stack_dtypes]
        for case in args.cases.split(","):
            rows, slots = (int(v) for v in case.split(":"))
            ms = cold_steps_ms(rows, slots, args.rank, dtypes, args.layers)
            print(
                f"rows {rows:3d} slots {slots}, {args.layers} layers: "
                + "  ".join(f"{str(d).removeprefix('torch.')} {t:6.2f}" for d, t in ms.items())
                + " ms a step"
            )
        return
    for case in args.cases.split(","):
        rows, slots = (int(v) for v in case.split(":"))
        times = {path: layer_us(rows, slots, args.rank, path) for path in PATHS}
        print(
            f"rows {rows:3d} slots {slots}: "
            + "  ".join(f"{p} {t:7.0f}" for p, t in times.items())
            + " us/layer"
        )


if __name__ == "__main__":
    main()
