"""Where one worker step's time goes: linears, attention, K/V gathers, sampling, Python between kernels;
and the share of the machine's read bandwidth its weight reads reach (decode_bandwidth.py).

    .venv/bin/python -m pagedserve.ops.microbench.step_profile [--dtype float32 bfloat16] [--batch 64]
                                                               [--backend torch cpp] [--steps 12]
                                                               [--prepack on off] [--fused-ops on off]
                                                               [--fused-layers on off]
                                                               [--quantization none gguf] [--no-breakdown]
                                                               [--layout kernel stored] [--model FOLDER]
                                                               [--kv-cache-dtype auto bfloat16 int8]

A ModelRunner on the bundled SmolLM2-135M (or `--model`, e.g. ops/models/random_moe_gguf.py's) holds
`--batch` requests whose contexts are spread like the bench workload's (16-256 prompt tokens plus what
they generated), samples at temperature 0.6, and runs decode steps. Wall time per step is the median of
un-profiled steps; the breakdown comes from one torch.profiler pass over a few more steps. Variants
(dtype x backend x prepacked weights or not x fused C++ layer ops or the plain torch ones x whole
decoder layers as one C++ call each or op by op x the bundled GGUF's weights dequantized or kept in
their stored types x those blocks in the kernel's layout or as stored x the KV cache's dtype) are interleaved step by step in one process, so a shared, noisy machine moves them
alike.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from pagedserve.ops.microbench.decode_bandwidth import read_bandwidth, weight_bytes_per_token
from pagedserve.ops.results import write_json
from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.worker.layers import moe, quant_linear
from pagedserve.services.worker.layers.packed_linear import PackedLinear
from pagedserve.services.worker.layers.quant_linear import QuantLinear
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.config import add_config_flag
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest, WorkerSampling

# Op -> category. Anything not listed counts as "other ops" (copies, views, embedding lookups).
CATEGORIES = {
    "aten::linear": "linears (incl. LM head)",
    "mkldnn::_linear_pointwise": "linears (incl. LM head)",
    "aten::index_select": "K/V gathers",
    "aten::scaled_dot_product_attention": "attention math (SDPA)",
    "aten::index_put_": "K/V writes",
    # A MoE layer's routing after its router linear (softmax, top-k, the renormalisation).
    "aten::softmax": "MoE routing (softmax, top-k)",
    "aten::topk": "MoE routing (softmax, top-k)",
}
# Our C++ ops live in a namespace per ISA path (pagedserve_paged_attention_avx512::paged_attention):
# matched by their name.
SUFFIXES = {
    "::quant_linear": "linears (incl. LM head)",
    "::quant_rows": "embedding rows (quantized)",
    "::moe_experts": "MoE experts (C++, incl. their linears)",
    "::paged_attention": "attention (C++ paged kernel)",
    "::write_kv": "K/V writes",
    "::rms_norm": "norms, adds, SiLU, rotary (C++ fused)",
    "::fused_add_rms_norm": "norms, adds, SiLU, rotary (C++ fused)",
    "::silu_and_mul": "norms, adds, SiLU, rotary (C++ fused)",
    "::rotary_": "norms, adds, SiLU, rotary (C++ fused)",
}
LABELS = ("sample", "pack_batch")
LINEAR_LABEL = "linear "  # + out x in: one profiler row per linear shape (label_linears)


def category(name: str) -> str | None:
    if name in CATEGORIES:
        return CATEGORIES[name]
    return next((c for suffix, c in SUFFIXES.items() if name.endswith(suffix)), None)


class Variant:
    def __init__(
        self,
        dtype: str,
        backend: str,
        batch: int,
        block_size: int,
        seed: int,
        prepack: bool = True,
        fused_ops: bool = True,
        fused_layers: bool = True,
        quantization: str = "none",
        model: str = "smollm2-135m",
        layout: str = "kernel",
        kv_cache_dtype: str = "auto",
    ) -> None:
        self.name = f"{dtype}/{backend}" + ("" if prepack else "/dense")
        self.name += "" if kv_cache_dtype == "auto" else f"/kv-{kv_cache_dtype}"
        self.name += "" if quantization == "none" else f"/{quantization}"
        self.name += "" if layout == "kernel" else f"/{layout}"
        path = resolve_model(model)
        rng = random.Random(seed)
        self.prompt_lens = [rng.randint(16, 256) for _ in range(batch)]
        budget = max(self.prompt_lens) + 512
        blocks_each = -(-budget // block_size)
        with ExitStack() as stack:
            if layout == "stored":  # the GGUF's blocks as stored, not the kernel's interleaved rows
                for module in (quant_linear, moe):
                    stack.enter_context(mock.patch.object(module, "kernel_layout", _stored_layout))
            self.runner = ModelRunner(
                path,
                dtype=dtype,
                block_size=block_size,
                num_blocks=batch * blocks_each + 1,
                attention_backend=backend,
                prepack_weights=prepack,
                quantization=quantization,
                kv_cache_dtype=kv_cache_dtype,
            )
        if prepack and self.runner.num_prepacked:
            self.name += "/prepacked"
        # "fused": our C++ norms, adds and SiLU-and-mul; "torch-ops": the plain forms.
        self.name += "/fused" if self.runner.model.use_fused_ops(fused_ops) == "cpp" else "/torch-ops"
        # "layer-op": decoder layers as one C++ call each, where they qualify (layers/fused_layer.py)
        self.name += "/layer-op" if self.runner.model.use_fused_layers(fused_layers) else ""
        params = WorkerSampling.of(SamplingParams(temperature=0.6, ignore_eos=True), None)
        vocab = self.runner.vocab_size
        self.ids = [f"r{i}" for i in range(batch)]
        news = [
            NewRequest(
                rid,
                [rng.randrange(vocab) for _ in range(n)],
                n,
                0,
                n,
                list(range(i * blocks_each + 1, (i + 1) * blocks_each + 1)),
                params,
            )
            for i, (rid, n) in enumerate(zip(self.ids, self.prompt_lens, strict=True))
        ]
        self.step_no = 0
        for chunk in range(0, batch, 8):  # prefill in chunks of 8 requests, as the scheduler would
            self.execute(Execute(self._next(), new_requests=news[chunk : chunk + 8]))

    def _next(self) -> int:
        self.step_no += 1
        return self.step_no

    def execute(self, step: Execute) -> float:
        t0 = time.perf_counter()
        self.runner.execute(step)
        return time.perf_counter() - t0

    def decode(self) -> float:
        return self.execute(Execute(self._next(), cached_requests=[CachedRequest(r, 1) for r in self.ids]))


def _stored_layout(ops: Any, mode: int, type_id: int, blocks: torch.Tensor) -> tuple[int, torch.Tensor]:
    return type_id, blocks


def _label(obj: Any, attr: str, label: str) -> None:
    """Wrap obj.attr in a profiler label, so its time shows up as one row."""
    inner: Callable[..., Any] = getattr(obj, attr)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with record_function(label):
            return inner(*args, **kwargs)

    setattr(obj, attr, wrapped)


def label_linears(model: nn.Module) -> None:
    """Each linear (dense, packed or quantized, the LM head included) under a profiler label naming
    its shape, so one step's linear time splits by shape: `linear 960x576` is every q/k/v projection."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, PackedLinear, QuantLinear)):
            _label(module, "forward", f"{LINEAR_LABEL}{module.out_features}x{module.in_features}")
    if model.lm_head is None and model.tied_head is None:  # the dense tied head: F.linear on the embedding
        head = model.embed_tokens.weight
        _label(model, "compute_logits", f"{LINEAR_LABEL}{head.shape[0]}x{head.shape[1]} (F.linear)")


def breakdown(variant: Variant, steps: int) -> dict[str, float]:
    """ms per step by category, from one profiled pass; rows named `linear OUTxIN` split the linears'
    time by weight shape (inside the category, not added to it)."""
    import pagedserve.services.worker.runner as runner_module

    _label(variant.runner.sampler, "sample", "sample")
    label_linears(variant.runner.model)
    pack = runner_module.pack_batch
    runner_module.pack_batch = lambda *a, **k: _timed_pack(pack, *a, **k)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            wall = sum(variant.decode() for _ in range(steps))
    finally:
        runner_module.pack_batch = pack
    totals: dict[str, float] = {}
    top_level = 0.0
    events = prof.events()
    # The stepping thread's events only: ops a C++ op runs on its parallel region's other threads
    # (moe_experts' quant_linear calls) are inside that op's time already.
    main = next((e.thread for e in events if e.name == "sample"), None)
    for event in events:
        if main is not None and event.thread != main:
            continue
        ms = event.cpu_time_total / 1e3 / steps
        if event.cpu_parent is None:  # nobody's child: against the wall, the Python between ops
            top_level += ms
        labelled = event.name in LABELS or event.name.startswith(LINEAR_LABEL)
        kind = category(event.name) or (event.name if labelled else None)
        if kind is None or _inside_counted(event):
            continue  # counted once, as its outermost categorized op (moe_experts, not its linears)
        totals[kind] = totals.get(kind, 0.0) + ms
    totals["step wall"] = wall * 1e3 / steps
    totals["python between ops"] = max(0.0, totals["step wall"] - top_level)
    kinds = {*CATEGORIES.values(), *SUFFIXES.values()}
    accounted = sum(v for k, v in totals.items() if k in kinds or k == "sample")
    # A linear's label wraps its op: the label's time is the op's plus the Python around it.
    totals["other ops"] = max(0.0, top_level - accounted - totals.get("pack_batch", 0.0))
    return totals


def _inside_counted(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if category(parent.name) is not None or parent.name in LABELS:
            return True
        parent = parent.cpu_parent
    return False


def _timed_pack(pack: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with record_function("pack_batch"):
        return pack(*args, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--backend", nargs="+", default=["torch"])
    ap.add_argument("--batch", type=int, default=64)
    add_config_flag(ap, "block_size", 16)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--prepack", nargs="+", choices=["on", "off"], default=["on"])
    ap.add_argument("--fused-ops", nargs="+", choices=["on", "off"], default=["on"])
    ap.add_argument("--fused-layers", nargs="+", choices=["on", "off"], default=["on"])
    ap.add_argument(
        "--quantization", nargs="+", choices=["none", "gguf"], default=["none"], help="the GGUF's weights"
    )
    ap.add_argument(
        "--layout",
        nargs="+",
        choices=["kernel", "stored"],
        default=["kernel"],
        help="quantized weights in the kernel's layout (rows interleaved where it runs them) or as stored",
    )
    add_config_flag(ap, "kv_cache_dtype", ["auto"], nargs="+")  # variants, one per dtype
    ap.add_argument("--no-breakdown", action="store_true", help="step times only, no profiled pass")
    ap.add_argument("--out", type=Path, default=None, help="write the step times and breakdowns as JSON")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    add_config_flag(ap, "model")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    print(f"load average at start: {load_start}")
    variants = [
        Variant(
            d,
            b,
            args.batch,
            args.block_size,
            0,
            prepack=p == "on",
            fused_ops=f == "on",
            fused_layers=fl == "on",
            quantization=q,
            model=args.model,
            layout=lay,
            kv_cache_dtype=kv,
        )
        for d in args.dtype
        for b in args.backend
        for p in args.prepack
        for f in args.fused_ops
        for fl in args.fused_layers
        for q in args.quantization
        for lay in args.layout
        for kv in args.kv_cache_dtype
    ]
    for v in variants:
        v.decode()  # warm-up
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(args.steps):
        for v in variants:  # interleaved: load changes hit every variant alike
            times[v.name].append(v.decode())
    for v in variants:
        print(
            f"{v.name}: median decode step {statistics.median(times[v.name]) * 1e3:.1f} ms at B={args.batch}"
        )
    # The share of the machine's read bandwidth a step's weight reads reach (decode_bandwidth.py).
    bandwidth = read_bandwidth(args.threads)
    print(f"read bandwidth: {bandwidth / 1e9:.1f} GB/s (torch.sum over 512 MiB, {args.threads} threads)")
    weights_read: dict[str, dict[str, float]] = {}
    for v in variants:
        nbytes = weight_bytes_per_token(v.runner.model)
        rate = nbytes / statistics.median(times[v.name])
        weights_read[v.name] = {
            "mb": round(nbytes / 1e6, 1),
            "gb_s": round(rate / 1e9, 2),
            "of_bandwidth": round(rate / bandwidth, 3),
        }
        print(
            f"{v.name}: reads {nbytes / 1e6:.1f} MB of weights a step (one token's): {rate / 1e9:.1f} GB/s, "
            f"{100 * rate / bandwidth:.0f}% of the machine's"
        )
    report: dict[str, Any] = {
        "batch": args.batch,
        "model": args.model,
        "threads": args.threads,
        "steps": args.steps,
        "load_average_at_start": load_start,
        "load_average_after_steps": os.getloadavg(),
        "median_step_ms": {v.name: round(statistics.median(times[v.name]) * 1e3, 2) for v in variants},
        "step_ms": {v.name: [round(t * 1e3, 2) for t in times[v.name]] for v in variants},
        "read_bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "weights_read": weights_read,
        "profiled_ms": {},
    }
    for v in variants if not args.no_breakdown else []:
        rows = breakdown(v, max(4, args.steps // 3))
        wall = rows.pop("step wall")
        print(f"\n{v.name} profiled step {wall:.1f} ms")
        shapes = {k: rows.pop(k) for k in list(rows) if k.startswith(LINEAR_LABEL)}
        for name, ms in sorted(rows.items(), key=lambda kv: -kv[1]):
            print(f"  {name:38s} {ms:7.2f} ms  {100 * ms / wall:5.1f}%")
        for name, ms in sorted(shapes.items(), key=lambda kv: -kv[1]):  # with the Python of each call
            print(f"    {name:36s} {ms:7.2f} ms  {100 * ms / wall:5.1f}%")
        rows.update(shapes)
        report["profiled_ms"][v.name] = {
            "step": round(wall, 2),
            **{k: round(ms, 2) for k, ms in rows.items()},
        }
    report["load_average_at_end"] = os.getloadavg()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.out, report)
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
