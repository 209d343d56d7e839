"""Memory per tensor-parallel rank: each rank's part of a model loaded as a worker loads it (dense,
float32 by default), its weights split into what the rank holds alone and what every rank repeats,
and its KV bytes per block. Ranks are loaded one after another in this process (no group is joined:
loading needs none), so the numbers are the tensors' own bytes, without torch's ~250 MiB per process.

    python -m pagedserve.ops.microbench.tp_memory --model smollm2-135m --sizes 1 3 [--out f.json]

A size whose model does not divide (SmolLM2-135M's 9 heads by 2) is reported with the refusal.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from pagedserve.kernels.attention import get_backend
from pagedserve.ops.microbench.ab_report import write_report
from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.worker.kv_cache import KVCacheShape
from pagedserve.services.worker.tensor_parallel import GroupRefused
from pagedserve.services.worker.tensor_parallel.shard import COLUMN_PARALLEL, ROW_PARALLEL, RankShard
from pagedserve.services.worker.weights.loader import load_model, torch_dtype
from pagedserve.shared.config import add_config_flag

MiB = 1 << 20
SPLIT = COLUMN_PARALLEL | ROW_PARALLEL | {"qkv_proj", "gate_up_proj"}  # our fused names too


def rank_row(model_path: Path, size: int, dtype: str, block_size: int) -> dict[str, Any]:
    """Rank 0's part (every rank's is the same size: the split is even)."""
    try:
        loaded = load_model(model_path, get_backend("torch", "cpu"), dtype=dtype, shard=RankShard(0, size))
    except GroupRefused as e:
        return {"tensor_parallel_size": size, "refused": str(e)}
    split = replicated = 0
    for name, param in loaded.model.named_parameters():
        nbytes = param.numel() * param.element_size()
        if SPLIT & set(name.split(".")):
            split += nbytes
        else:
            replicated += nbytes
    cfg = loaded.config
    kv = KVCacheShape(cfg.num_layers, block_size, cfg.num_kv_heads, cfg.head_dim, torch_dtype(dtype))
    return {
        "tensor_parallel_size": size,
        "heads_per_rank": cfg.num_heads,
        "kv_heads_per_rank": cfg.num_kv_heads,
        "split_weights_mib": round(split / MiB, 2),
        "replicated_weights_mib": round(replicated / MiB, 2),
        "weights_per_rank_mib": round((split + replicated) / MiB, 2),
        "kv_per_block_kib": round(kv.bytes_per_block / 1024, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_config_flag(parser, "model")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3], help="tensor_parallel_size values")
    add_config_flag(parser, "dtype", default="float32")
    add_config_flag(parser, "block_size")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_path = resolve_model(args.model)
    rows = [rank_row(model_path, size, args.dtype, args.block_size) for size in args.sizes]
    for row in rows:
        print(row)
    write_report(
        args.out, {"model": args.model, "dtype": args.dtype, "block_size": args.block_size, "rows": rows}
    )


if __name__ == "__main__":
    main()
