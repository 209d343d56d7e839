"""The three in-process paths of `pagedserve bench`, each timed on the same workload.

- pagedserve: `LLM.generate` over every request at once (continuous batching on a paged pool);
- hf-static: transformers `generate` in fixed batches, each running to its longest request;
- hf-continuous: transformers' own continuous batching (`continuous_batching_context_manager`).

Only generation is timed: model loading, KV allocation and a short warm-up are not, for any path.
Throughput counts each request's own output tokens only.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pagedserve.ops.bench.workload import Workload, static_batch_accounting, static_batches
from pagedserve.services.checkpoint import read_checkpoint
from pagedserve.services.worker.kv_cache import KVCacheShape, num_blocks_for_budget
from pagedserve.services.worker.models.registry import ModelConfig, parse_config
from pagedserve.services.worker.weights.loader import torch_dtype

# Shorter than one block: a warm-up prompt is never a prefix-cache hit for the workload.
WARMUP_PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1]]
WARMUP_TOKENS = 4


@dataclass(frozen=True, slots=True)
class BenchSettings:
    model_path: Path
    dtype: str
    block_size: int
    kv_cache_memory: int  # bytes, for pagedserve's pool and transformers' paged cache alike
    max_num_seqs: int
    max_num_batched_tokens: int
    pipeline_depth: int
    temperature: float
    seed: int
    quantization: str = "none"

    def model_config(self) -> ModelConfig:
        return parse_config(read_checkpoint(self.model_path).config)

    def num_blocks(self) -> int:
        cfg = self.model_config()
        shape = KVCacheShape(
            cfg.num_layers, self.block_size, cfg.num_kv_heads, cfg.head_dim, torch_dtype(self.dtype)
        )
        return num_blocks_for_budget(shape, self.kv_cache_memory)


@dataclass(slots=True)
class PathResult:
    name: str
    output_tokens: int = 0
    wall_s: float = 0.0
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 and self.error is None else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "output_tokens": self.output_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "error": self.error,
            **self.details,
        }


# ---------------------------------------------------------------- pagedserve


def run_pagedserve(workload: Workload, settings: BenchSettings) -> PathResult:
    from pagedserve.engine.llm import LLM
    from pagedserve.shared.protocol.frontend import SamplingParams

    llm = LLM(
        str(settings.model_path),
        block_size=settings.block_size,
        kv_cache_memory=settings.kv_cache_memory,
        pipeline_depth=settings.pipeline_depth,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        dtype=settings.dtype,
        quantization=settings.quantization,
    )
    llm.generate(WARMUP_PROMPTS, SamplingParams(max_tokens=WARMUP_TOKENS, ignore_eos=True), use_tqdm=False)
    before = dataclasses.replace(llm.scheduler.stats)
    params = [
        SamplingParams(max_tokens=n, temperature=settings.temperature, ignore_eos=True)
        for n in workload.output_lens
    ]
    t0 = time.perf_counter()
    outputs = llm.generate(workload.prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    after = llm.scheduler.stats
    delta = {f.name: getattr(after, f.name) - getattr(before, f.name) for f in dataclasses.fields(after)}
    held = delta["kv_slots_held"]
    return PathResult(
        "pagedserve",
        output_tokens=sum(len(o.token_ids) for o in outputs),
        wall_s=wall,
        details={
            "kv_utilization": delta["kv_slots_used"] / held if held else 0.0,
            "steps": delta["steps"],
            "preemptions": delta["preemptions"],
            "mean_tokens_per_step": delta["generated_tokens"] / delta["steps"] if delta["steps"] else 0.0,
            "num_blocks": llm.runner.num_blocks,
            "block_size": llm.runner.block_size,
            "max_model_len": llm.max_model_len,
            "pipeline_depth": settings.pipeline_depth,
            "weights": llm.runner.runtime["weights"],
        },
    )


# ---------------------------------------------------------------- transformers, static batches


def load_hf_model(settings: BenchSettings) -> Any:
    from transformers import AutoModelForCausalLM

    path = settings.model_path
    # A GGUF: transformers dequantizes it in memory (its own reader; slow, but only the peer pays).
    where = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    if path.suffix != ".gguf":
        where = {"pretrained_model_name_or_path": str(path)}
    model = AutoModelForCausalLM.from_pretrained(
        **where, dtype=torch_dtype(settings.dtype), attn_implementation="sdpa"
    )
    return model.eval()


def pad_token_id(model: Any) -> int:
    for candidate in (
        model.generation_config.pad_token_id,
        model.config.pad_token_id,
        model.config.eos_token_id,
    ):
        if isinstance(candidate, int):
            return candidate
    return 0


def _left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _generate_static(
    model: Any, prompts: list[list[int]], new_tokens: int, temperature: float, pad: int
) -> int:
    """One padded batch; returns how many tokens each row generated (all the same: EOS is masked)."""
    ids, mask = _left_padded(prompts, pad)
    # min_new_tokens == max_new_tokens masks EOS until the end: every row runs the full length, as
    # ignore_eos does on the other paths. top_k=0 / top_p=1 switch off transformers' default top-k 50.
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=pad,
    )
    return out.shape[1] - ids.shape[1]


@torch.inference_mode()
def run_hf_static(workload: Workload, settings: BenchSettings, batch_sizes: list[int]) -> list[PathResult]:
    model = load_hf_model(settings)
    pad = pad_token_id(model)
    _generate_static(model, WARMUP_PROMPTS, WARMUP_TOKENS, settings.temperature, pad)
    results = []
    for batch_size in batch_sizes:
        result = PathResult(f"hf-static bs={batch_size}", details={"batch_size": batch_size})
        try:
            own = 0
            for batch in static_batches(len(workload), batch_size):
                lens = [workload.output_lens[i] for i in batch]
                t0 = time.perf_counter()
                generated = _generate_static(
                    model, [workload.prompts[i] for i in batch], max(lens), settings.temperature, pad
                )
                result.wall_s += time.perf_counter() - t0
                # The batch ran to its longest request; the others' extra tokens were not asked for.
                own += sum(min(n, generated) for n in lens)
            accounting = static_batch_accounting(workload, batch_size)
            result.output_tokens = own
            result.details.update(
                decoded_tokens=accounting.decoded_tokens, kv_utilization=accounting.kv_utilization
            )
        except Exception as e:  # e.g. out of memory at a large batch: report it, keep the others
            result.error = f"{type(e).__name__}: {e}"
        results.append(result)
    return results


# ---------------------------------------------------------------- transformers, continuous batching


@torch.inference_mode()
def run_hf_continuous(workload: Workload, settings: BenchSettings) -> PathResult:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    model = load_hf_model(settings)
    num_blocks = settings.num_blocks()
    # Same pool as ours: a transformers "block" is page_size tokens of K and V over every layer,
    # exactly our block, so equal counts are equal bytes.
    cb_config = ContinuousBatchingConfig(
        page_size=settings.block_size,
        num_blocks=num_blocks,
        max_batch_tokens=settings.max_num_batched_tokens,
        max_requests_per_batch=settings.max_num_seqs,
        auto_switch_to_flash=False,
        use_cuda_graph=False,
        use_async_batching=False,
        seed=settings.seed,
    )
    gen_config = GenerationConfig(
        do_sample=True,
        temperature=settings.temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max(workload.output_lens),
        eos_token_id=-1,
        pad_token_id=pad_token_id(model),
    )
    details: dict[str, Any] = {
        "attn_implementation": model.config._attn_implementation,
        "num_blocks": num_blocks,
        "page_size": settings.block_size,
        "max_batch_tokens": settings.max_num_batched_tokens,
    }
    with model.continuous_batching_context_manager(
        generation_config=gen_config,
        continuous_batching_config=cb_config,
        warmup=False,
        block=True,
        timeout=30,
    ) as manager:
        _collect(
            manager,
            [manager.add_request(p, max_new_tokens=WARMUP_TOKENS, eos_token_id=-1) for p in WARMUP_PROMPTS],
        )
        t0 = time.perf_counter()
        # eos_token_id=-1 is transformers' "no EOS": every request runs to its own max_new_tokens.
        ids = [
            manager.add_request(p, request_id=f"bench-{i}", max_new_tokens=n, eos_token_id=-1)
            for i, (p, n) in enumerate(zip(workload.prompts, workload.output_lens, strict=True))
        ]
        outputs = _collect(manager, ids)
        wall = time.perf_counter() - t0
    return PathResult(
        "hf-continuous",
        output_tokens=sum(len(o.generated_tokens) for o in outputs),
        wall_s=wall,
        details=details,
    )


def _collect(manager: Any, request_ids: list[str | None]) -> list[Any]:
    """Wait for every request; a generation thread that dies is an error, not a hang."""
    if any(rid is None for rid in request_ids):
        raise RuntimeError("transformers' continuous batching manager refused a request")
    pending, done = set(request_ids), {}
    while pending:
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError(
                    "transformers' continuous batching thread stopped with requests unfinished"
                )
            continue
        if result.error:
            raise RuntimeError(
                f"transformers' continuous batching failed request {result.request_id}: {result.error}"
            )
        if result.is_finished() and result.request_id in pending:
            pending.discard(result.request_id)
            done[result.request_id] = result
    return [done[rid] for rid in request_ids]
