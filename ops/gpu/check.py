"""GPU check of the Triton attention kernels: a correctness sweep compiled for real, then decode timing.

Run it through ops/gpu_check.sh on a CUDA machine (`python -m pagedserve.ops.gpu.check`). Imports only
torch, triton and pagedserve.kernels (the dense reference included): the GPU image has no pyzmq, pydantic
or structlog.

Decode attention is memory-bound, so its figure of merit is achieved bandwidth: bytes of K/V (and
Q/O) it must read or write over its time, as a fraction of the device's peak.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

# Before the kernels are imported: @triton.jit picks compiler or interpreter when a kernel is defined.
os.environ.setdefault("TRITON_INTERPRET", "0")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

from pagedserve.kernels.attention import AttentionMetadata  # noqa: E402
from pagedserve.kernels.paged_reference import TOLERANCES, make_paged_batch, reference_attention  # noqa: E402
from pagedserve.kernels.torch_backend import TorchAttentionBackend  # noqa: E402
from pagedserve.kernels.triton.backend import TritonAttentionBackend  # noqa: E402
from pagedserve.kernels.triton.decode_attention import choose_num_splits, decode_attention  # noqa: E402
from pagedserve.ops.results import write_json

# Peak HBM bandwidth in TB/s by device-name substring, most specific first (GH200 contains "H200").
PEAK_TBS: list[tuple[str, float]] = [
    ("GH200", 4.0),
    ("H200", 4.8),
    ("H100 NVL", 3.9),
    ("H100 PCIe", 2.0),
    ("H100", 3.35),
    ("H800", 3.35),
    ("B200", 8.0),
    ("A100-SXM4-80GB", 2.04),
    ("A100 80GB PCIe", 1.94),
    ("A100", 1.56),
    ("L40S", 0.864),
    ("L40", 0.864),
    ("L4", 0.3),
    ("A10G", 0.6),
    ("A10", 0.6),
    ("RTX 4090", 1.01),
]


def peak_tbs(device_name: str) -> float | None:
    """PAGEDSERVE_PEAK_TBS overrides the table (for a device it lacks or a clock-limited one)."""
    if override := os.environ.get("PAGEDSERVE_PEAK_TBS"):
        return float(override)
    return next((tbs for key, tbs in PEAK_TBS if key in device_name), None)


def _meta(
    seq_lens: list[int], query_lens: list[int], tables: torch.Tensor, device: torch.device
) -> AttentionMetadata:
    start = [0]
    for q in query_lens:
        start.append(start[-1] + q)
    return AttentionMetadata(
        slot_mapping=torch.zeros(start[-1], dtype=torch.int64, device=device),  # unused by forward
        query_start_loc=torch.tensor(start, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=list(query_lens),
        seq_lens_cpu=list(seq_lens),
    )


# ---------------------------------------------------------------- correctness, compiled

# (name, seq_lens, query_lens, heads, kv_heads, head_dim, block_size)
SWEEP: list[tuple[str, list[int], list[int], int, int, int, int]] = [
    ("decode llama-8b shape, long mixed", [1, 17, 300, 1025, 4000, 2500] * 4, [1] * 24, 32, 8, 128, 16),
    ("decode one kv head, split-heavy", [20000, 9000, 3], [1, 1, 1], 8, 1, 64, 128),
    ("mixed smollm shape, block 8", [40, 600, 1, 513, 90, 7], [1, 512, 1, 100, 90, 0], 9, 3, 64, 8),
    ("mixed head_dim 80", [300, 64, 1000], [1, 64, 33], 4, 2, 80, 32),
    ("mixed head_dim 96", [300, 64, 1000], [1, 64, 1], 16, 2, 96, 64),
    ("prefill only, long", [2000, 1500], [2000, 700], 4, 2, 128, 64),
]


def correctness_sweep(device: torch.device) -> list[dict[str, Any]]:
    results = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for name, seq_lens, query_lens, heads, kv_heads, head_dim, block_size in SWEEP:
            batch = make_paged_batch(
                seq_lens, query_lens, heads, kv_heads, head_dim, block_size, dtype, device, seed=len(results)
            )
            scale = head_dim**-0.5
            backend = TritonAttentionBackend()
            # Erase this step's rows, then write them back through the kernel, as a layer does.
            expected_k = batch.k_cache.clone()
            batch.k_cache.view(-1, kv_heads, head_dim)[batch.slot_mapping] = 0
            batch.v_cache.view(-1, kv_heads, head_dim)[batch.slot_mapping] = 0
            backend.write_kv(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.slot_mapping)
            meta = _meta(batch.seq_lens_list, batch.query_lens, batch.block_tables, device)
            out = backend.forward(batch.query, batch.k_cache, batch.v_cache, meta, scale).float().cpu()
            torch_out = TorchAttentionBackend().forward(
                batch.query, batch.k_cache, batch.v_cache, meta, scale
            )
            ref = reference_attention(batch, scale)
            atol, rtol = TOLERANCES[dtype]
            err = (out - ref).abs().max().item() if out.numel() else 0.0
            ok = torch.equal(batch.k_cache, expected_k) and torch.allclose(out, ref, atol=atol, rtol=rtol)
            ok = ok and torch.allclose(out, torch_out.float().cpu(), atol=atol, rtol=rtol)
            results.append({"case": name, "dtype": str(dtype), "max_abs_err": err, "ok": bool(ok)})
            print(f"{'ok  ' if ok else 'FAIL'} {str(dtype):15} {name:36} max |err| {err:.2e}", flush=True)
    return results


# ---------------------------------------------------------------- decode timing

# (name, batch, context, heads, kv_heads, head_dim); contexts "mixed" draw from 16..8192.
DECODE_CASES: list[tuple[str, int, int | str, int, int, int]] = [
    ("llama-8b", 1, 32768, 32, 8, 128),
    ("llama-8b", 8, 1024, 32, 8, 128),
    ("llama-8b", 8, 8192, 32, 8, 128),
    ("llama-8b", 32, 2048, 32, 8, 128),
    ("llama-8b", 64, 4096, 32, 8, 128),
    ("llama-8b", 128, 2048, 32, 8, 128),
    ("llama-8b", 256, 1024, 32, 8, 128),
    ("llama-8b", 64, "mixed", 32, 8, 128),
    ("smollm2-135m", 64, 1024, 9, 3, 64),
    ("smollm2-135m", 256, 1024, 9, 3, 64),
]


def time_decode(device: torch.device, peak: float | None) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    results = []
    for model, batch, context, heads, kv_heads, head_dim in DECODE_CASES:
        if context == "mixed":
            seq_lens = torch.randint(16, 8193, (batch,), generator=gen).tolist()
        else:
            seq_lens = [int(context)] * batch
        row = _time_decode_case(device, seq_lens, heads, kv_heads, head_dim)
        row |= {"model": model, "batch": batch, "context": context}
        row["fraction_of_peak"] = row["tb_per_s"] / peak if peak else None
        results.append(row)
        frac = f"{row['fraction_of_peak']:.0%}" if peak else "n/a"
        print(
            f"{model:13} B={batch:<4} ctx={context!s:6} splits={row['num_splits']:<3} "
            f"triton {row['triton_ms']:8.4f} ms (no split {row['triton_no_split_ms']:8.4f})  "
            f"torch {row['torch_ms']:8.4f} ms  {row['tb_per_s']:5.2f} TB/s = {frac} of peak  "
            f"x{row['speedup_vs_torch']:.1f} vs torch",
            flush=True,
        )
        torch.cuda.empty_cache()
    return results


def _time_decode_case(
    device: torch.device,
    seq_lens: list[int],
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, Any]:
    batch = len(seq_lens)
    blocks = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    # Shuffled block ids: a real pool hands out scattered blocks, not one contiguous run.
    ids = torch.randperm(num_blocks, device=device).to(torch.int32)
    tables = torch.zeros(batch, max(blocks), dtype=torch.int32, device=device)
    taken = 0
    for b, n in enumerate(blocks):
        tables[b, :n] = ids[taken : taken + n]
        taken += n
    meta = _meta(seq_lens, [1] * batch, tables, device)
    query = torch.randn(batch, heads, head_dim, device=device, dtype=dtype)
    out = torch.empty_like(query)
    scale = head_dim**-0.5
    triton_backend, torch_backend = TritonAttentionBackend(), TorchAttentionBackend()

    def run_no_split() -> None:
        decode_attention(
            query, k_cache, v_cache, tables, meta.seq_lens, meta.query_start_loc, out, scale,
            max_seq_len=max(seq_lens), num_splits=1,
        )  # fmt: skip

    # do_bench flushes L2 between runs: small caches would otherwise be read from L2, not HBM.
    def bench(fn: Any) -> float:
        return triton.testing.do_bench(fn, return_mode="median")

    triton_ms = bench(lambda: triton_backend.forward(query, k_cache, v_cache, meta, scale))
    torch_ms = bench(lambda: torch_backend.forward(query, k_cache, v_cache, meta, scale))
    elem = k_cache.element_size()
    moved = sum(seq_lens) * kv_heads * head_dim * 2 * elem + 2 * query.numel() * elem
    return {
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "dtype": str(dtype),
        "block_size": block_size,
        "num_splits": choose_num_splits(batch * kv_heads, max(seq_lens), device),
        "bytes": moved,
        "triton_ms": triton_ms,
        "triton_no_split_ms": bench(run_no_split),
        "torch_ms": torch_ms,
        "tb_per_s": moved / (triton_ms * 1e-3) / 1e12,
        "speedup_vs_torch": torch_ms / triton_ms,
    }


def _markdown(device_name: str, peak: float | None, sweep: list[dict], decode: list[dict]) -> str:
    lines = [
        f"# Triton attention on {device_name}",
        "",
        f"torch {torch.__version__}, triton {triton.__version__}, peak {peak or 'unknown'} TB/s; "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
        "## Correctness (compiled), vs dense reference and torch backend",
        "",
        "| case | dtype | max abs err | ok |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['case']} | {r['dtype']} | {r['max_abs_err']:.2e} | {r['ok']} |" for r in sweep]
    lines += [
        "",
        "## Decode attention, bf16, block 16 (median ms, L2 flushed between runs)",
        "",
        "| model | batch | context | splits | triton ms | no-split ms | torch ms | TB/s | of peak | vs torch |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in decode:
        frac = f"{r['fraction_of_peak']:.0%}" if r["fraction_of_peak"] is not None else "n/a"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['context']} | {r['num_splits']} | {r['triton_ms']:.4f} | "
            f"{r['triton_no_split_ms']:.4f} | {r['torch_ms']:.4f} | {r['tb_per_s']:.2f} | {frac} | "
            f"{r['speedup_vs_torch']:.1f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu"))
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or triton.knobs.runtime.interpret:
        print("gpu_check: needs a CUDA device and TRITON_INTERPRET unset or 0", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    peak = peak_tbs(name)
    print(f"gpu_check: {name}, peak {peak or 'unknown (set PAGEDSERVE_PEAK_TBS)'} TB/s", flush=True)
    sweep = [] if args.skip_sweep else correctness_sweep(device)
    decode = time_decode(device, peak)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"device": name, "peak_tb_per_s": peak, "torch": torch.__version__, "triton": triton.__version__}
    report |= {"correctness": sweep, "decode": decode}
    write_json((args.out / "attention.json"), report)
    (args.out / "attention.md").write_text(_markdown(name, peak, sweep, decode))
    print(f"gpu_check: wrote {args.out / 'attention.md'}")
    return 0 if all(r["ok"] for r in sweep) else 1


if __name__ == "__main__":
    sys.exit(main())
