"""How close a path comes to this machine's matmul speed: model FLOP/s over a matmul ceiling.

- The workload's model FLOPs, from the model config and the workload's lengths (`model_flops`): the
  work any engine must do, whatever its kernels, counted as multiply-adds x 2:
  - the decoder layers' matmuls (q, k, v, o, gate, up, down: 2 x their weights' elements) for every
    position the model reads: each request's prompt and every output token but its last (which is
    sampled, never fed back);
  - the LM head (2 x hidden x vocab) for every position whose logits are sampled: one per output
    token (the last prompt position gives the first);
  - attention's two matmuls, QK^T and PV (2 x heads x head_dim each, per key), per layer, for each
    of those positions over its actual causal context (itself and everything before it).
  Not counted: embeddings (a lookup), norms, rotary, activations, biases, softmax, sampling; work an
  implementation adds (padding, logits for prompt positions, the masked half of a causal square).
- The ceiling (`matmul_ceiling`): the best FLOP/s of one GEMM at a shape typical of the model
  ([256 x hidden] x [hidden x intermediate]), in the bench's dtype and thread count, measured in the
  bench process before and after the peers: the faster of torch.mm and oneDNN's GEMM on a weight
  packed ahead (what our linears and vLLM's run). torch.mm alone read low on an AMD EPYC (Zen 4):
  its float32 goes to MKL, 68.5 GFLOP/s on one core against oneDNN's packed 87.5, so the float32
  paths there read as if near the ceiling. It is what a GEMM reaches on these cores at that moment,
  not a hardware peak.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedserve.ops.bench.workload import Workload
from pagedserve.services.worker.models.registry import ModelConfig

CEILING_ROWS = 256  # a decode batch of 64 is smaller, a prefill chunk bigger: a typical GEMM in between


@dataclass(frozen=True, slots=True)
class ModelFlops:
    layer_matmuls: int
    lm_head: int
    attention: int

    @property
    def total(self) -> int:
        return self.layer_matmuls + self.lm_head + self.attention

    def to_json(self) -> dict[str, int]:
        return {
            "layer_matmuls": self.layer_matmuls,
            "lm_head": self.lm_head,
            "attention": self.attention,
            "total": self.total,
        }


def layer_matmul_weights(cfg: ModelConfig) -> int:
    """Elements of one decoder layer's matmul weights: q, k, v, o and the gated MLP."""
    q_width, kv_width = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    attention = cfg.hidden_size * (q_width + 2 * kv_width) + q_width * cfg.hidden_size
    return attention + 3 * cfg.hidden_size * cfg.intermediate_size


def model_flops(cfg: ModelConfig, workload: Workload) -> ModelFlops:
    layer_weights = cfg.num_layers * layer_matmul_weights(cfg)
    # Per layer and per key: QK^T and PV, 2 FLOPs per multiply-add each, over every query head.
    attention_per_key = cfg.num_layers * 2 * 2 * cfg.num_heads * cfg.head_dim
    layer_positions = keys = 0
    for prompt, outputs in zip(workload.prompts, workload.output_lens, strict=True):
        positions = len(prompt) + outputs - 1  # the last output token is never fed back
        layer_positions += positions
        keys += positions * (positions + 1) // 2  # position i (1-based) attends to i keys
    return ModelFlops(
        layer_matmuls=2 * layer_weights * layer_positions,
        lm_head=2 * cfg.hidden_size * cfg.vocab_size * workload.output_tokens,
        attention=attention_per_key * keys,
    )


@dataclass(frozen=True, slots=True)
class Ceiling:
    flop_per_s: float
    shape: tuple[int, int, int]  # M, K, N of [M x K] x [K x N]
    dtype: str
    threads: int
    calls: int
    kernel: str = "torch.mm"  # the faster of the GEMMs timed: torch.mm or onednn-packed

    def to_json(self) -> dict[str, object]:
        return {
            "flop_per_s": self.flop_per_s,
            "shape_mkn": list(self.shape),
            "dtype": self.dtype,
            "threads": self.threads,
            "calls": self.calls,
            "kernel": self.kernel,
        }


def matmul_ceiling(
    dtype: str, shape: tuple[int, int, int], *, budget_s: float = 1.0, calls_per_sample: int = 10
) -> Ceiling:
    """The best FLOP/s of torch.mm, and of oneDNN's packed GEMM where this torch has it for `dtype`,
    at `shape`, over samples of `calls_per_sample` calls of each in turn, for about `budget_s` seconds
    (at least 3 samples each), at torch's current thread count."""
    from pagedserve.services.worker.layers.packed_linear import pack_linear

    m, k, n = shape
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(getattr(torch, dtype))
    b = torch.randn(k, n, generator=generator).to(getattr(torch, dtype))
    out = torch.empty(m, n, dtype=a.dtype)
    gemms: dict[str, Callable[[], object]] = {"torch.mm": lambda: torch.mm(a, b, out=out)}
    packed = pack_linear(b.t().contiguous())
    if packed is not None:
        gemms["onednn-packed"] = lambda: packed(a)
    for gemm in gemms.values():
        gemm()  # warm-up: oneDNN picks and caches its kernel on the first call
    best = dict.fromkeys(gemms, float("inf"))
    samples, started = 0, time.perf_counter()
    while samples < 3 or time.perf_counter() - started < budget_s:
        for name, gemm in gemms.items():  # alternated: load on shared cores hits both alike
            t0 = time.perf_counter()
            for _ in range(calls_per_sample):
                gemm()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls_per_sample)
        samples += 1
    kernel = min(best, key=best.__getitem__)
    calls = samples * calls_per_sample
    return Ceiling(2 * m * k * n / best[kernel], shape, dtype, torch.get_num_threads(), calls, kernel)


def ceiling_shape(cfg: ModelConfig) -> tuple[int, int, int]:
    return (CEILING_ROWS, cfg.hidden_size, cfg.intermediate_size)


def efficiency_json(flops: ModelFlops, ceilings: list[Ceiling]) -> dict[str, object]:
    """The report's `efficiency` section: the FLOP count and every ceiling probe; the highest probe
    is the ceiling each path is measured against (the machine reached it in this run)."""
    return {
        "model_flops": flops.to_json(),
        "ceiling_probes": [c.to_json() for c in ceilings],
        "ceiling_flop_per_s": max(c.flop_per_s for c in ceilings),
    }
