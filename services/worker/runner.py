"""The model runner: owns the model, the KV pool and every request's state; runs one Execute at a time.

No sockets here: the worker service loop feeds it decoded `Execute` messages and sends back the
`StepResult` it returns. The six steps of one Execute are defined in shared/protocol/step.py.
"""

from __future__ import annotations

import dataclasses
import functools
import mmap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import torch

from pagedserve.kernels.attention import get_backend
from pagedserve.kernels.kv_int8 import Int8KVBackend
from pagedserve.services.worker import pooling, prompt_logprobs
from pagedserve.services.worker.cpu_dtype import check_cpu_dtype
from pagedserve.services.worker.heap import RELEASE_AFTER_ROWS, keep_freed_heap, release_freed_heap
from pagedserve.services.worker.kv_budget import PoolSizing, sized_pool
from pagedserve.services.worker.kv_cache import KVCache, KVCacheShape, cuda_budget, resolve_kv_dtype
from pagedserve.services.worker.layers.packed_linear import linears_kind
from pagedserve.services.worker.layers.quant_linear import (
    dense_weights,
    quant_activations_kind,
    weight_layout,
    weight_types,
)
from pagedserve.services.worker.layers.rope import longrope_tokens
from pagedserve.services.worker.lora_slots import LoRASlots
from pagedserve.services.worker.models.registry import ModelConfig
from pagedserve.services.worker.packed_batch import PackedBatch, RequestState, pack_batch
from pagedserve.services.worker.proposers import Proposer, make_proposer, propose_all
from pagedserve.services.worker.proposers.draft_model import TargetFacts
from pagedserve.services.worker.request_constraints import RequestConstraints
from pagedserve.services.worker.sampler import Sampler, SamplingRequest
from pagedserve.services.worker.tensor_parallel.orders import forward_batch
from pagedserve.services.worker.verification import ScoredRequest, accepted_run, sampling_rows
from pagedserve.services.worker.weights.loader import load_model, resolve_dtype, torch_dtype
from pagedserve.shared import failpoints
from pagedserve.shared.config import ServeConfig, config_default
from pagedserve.shared.protocol.step import Execute, Fork, Speculated, StepResult
from pagedserve.shared.speculative_config import SpeculativeConfig

if TYPE_CHECKING:
    from pagedserve.services.worker.tensor_parallel.group import RankGroup
    from pagedserve.services.worker.tensor_parallel.shard import RankShard

# The ServeConfig fields a runner takes as they are, by the same names (ModelRunner.from_config).
CONFIGURED = (
    "dtype",
    "device",
    "block_size",
    "num_blocks",
    "kv_cache_memory",
    "kv_cache_share",
    "max_num_seqs",
    "max_model_len",
    "attention_backend",
    "gpu_memory_utilization",
    "prepack_weights",
    "quantization",
    "quant_activations",
    "tokenizer",
    "kv_cache_dtype",
    "speculative_config",
    "max_loras",
    "max_lora_rank",
    "max_cpu_loras",
    "lora_dtype",
)


class ModelRunner:
    @classmethod
    def from_config(cls, model_path: str | Path, config: ServeConfig, **given: Any) -> ModelRunner:
        """A runner with `config`'s CONFIGURED fields; `given` adds or replaces keywords (a worker's
        defer_pool, the engine's tokenizer folder)."""
        return cls(model_path, **({name: getattr(config, name) for name in CONFIGURED} | given))

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = config_default("dtype"),
        device: str = config_default("device"),
        block_size: int = config_default("block_size"),
        num_blocks: int | None = None,
        kv_cache_memory: int | str = config_default("kv_cache_memory"),
        kv_cache_share: float = config_default("kv_cache_share"),
        workers_per_machine: int = config_default("workers_per_machine"),
        max_num_seqs: int = config_default("max_num_seqs"),
        max_model_len: int | None = None,
        attention_backend: str = config_default("attention_backend"),
        gpu_memory_utilization: float = config_default("gpu_memory_utilization"),
        num_threads: int | None = None,
        prepack_weights: bool = config_default("prepack_weights"),
        quantization: str = config_default("quantization"),
        quant_activations: str | None = None,
        tokenizer: str | Path | None = None,
        kv_cache_dtype: str = config_default("kv_cache_dtype"),
        speculative_config: SpeculativeConfig | None = None,
        allow_slow_dtype: bool = False,
        max_loras: int = config_default("max_loras"),
        max_lora_rank: int = config_default("max_lora_rank"),
        max_cpu_loras: int = config_default("max_cpu_loras"),
        lora_dtype: str = config_default("lora_dtype"),
        defer_pool: bool = False,
        shard: RankShard | None = None,
        ranks: RankGroup | None = None,
    ) -> None:
        """model_path: a checkpoint folder or a .gguf file (services/checkpoint.py resolve_model).
        quant_activations: float32 or int8 for the linears kept quantized (None: the
        PAGEDSERVE_QUANT_ACTIVATIONS variable, else float32: a runner made outside a worker).
        tokenizer: a folder whose tokenizer replaces the model's (--tokenizer; structured outputs use it).
        allow_slow_dtype: load bfloat16/float16 even on a CPU without native support for it (tests of
        the model code in those dtypes on tiny models); a server refuses it (cpu_dtype.py).
        defer_pool: no KV pool until `attach_pool` (a worker that maps a shared-memory segment, or a
        standby that learns its name later).
        shard: a tensor-parallel rank's part of the model (tensor_parallel/shard.py); ranks: rank 0's
        group, which every step's forward inputs are sent to first (its shard is rank 0's)."""
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.device = torch.device(device)
        if self.device.type == "cpu":
            keep_freed_heap()  # the steps' large buffers reuse memory instead of faulting it in again
        dtype = resolve_dtype(dtype, self.device)
        if not allow_slow_dtype:
            check_cpu_dtype(dtype, self.device)  # UnsupportedDtype, naming the missing CPU feature
        self.dtype = dtype  # what `auto` became here
        backend = get_backend(attention_backend, self.device)
        kv_dtype = resolve_kv_dtype(kv_cache_dtype, torch_dtype(dtype), self.device, backend.name)
        if kv_dtype == torch.int8:
            backend = Int8KVBackend(backend)  # quantizes on write, dequantizes where it reads
        self.backend = backend
        self.attention_backend = backend.name
        self.prefilling = False  # the step being run computes part of a prompt (for failpoints)
        self.step_rows = 0  # the rows of the step being run
        self.last_step_s = 0.0  # the last step's wall time (adapter reads take a share of it between steps)
        self.model_path = Path(model_path)
        shard = ranks.shard if ranks is not None else shard
        loaded = load_model(
            model_path,
            backend,
            dtype=dtype,
            device=self.device,
            quantization=quantization,
            shard=shard,
            quant_activations=quant_activations,
        )
        self.model = loaded.model
        self.ranks = ranks
        if shard is not None:
            from pagedserve.services.worker.tensor_parallel.group import all_reduce_sum

            self.model.use_all_reduce(all_reduce_sum)
        # How many linears run on packed weights (0: off, or not available for this dtype/device).
        self.num_prepacked = self.model.prepack_weights() if prepack_weights else 0
        self._config = loaded.config
        # LoRA-aware linears wrap the (packed or quantized) projections only when adapters are enabled.
        self.loras: LoRASlots | None = None
        if max_loras > 0:
            self.loras = LoRASlots(
                self.model,
                max_loras=max_loras,
                max_lora_rank=max_lora_rank,
                max_cpu_loras=max_cpu_loras,
                dtype=torch_dtype(dtype if lora_dtype == "auto" else lora_dtype),
            )
        self._eos_token_ids = list(loaded.eos_token_ids)
        cfg = loaded.config
        self.kv_shape = KVCacheShape(cfg.num_layers, block_size, cfg.num_kv_heads, cfg.head_dim, kv_dtype)
        self.served_len = min(max_model_len or cfg.max_model_len, cfg.max_model_len)
        # Sized after the weights are loaded: `auto` takes a share of what they left.
        self.size_pool = functools.partial(
            sized_pool,
            self.kv_shape.bytes_per_block,
            block_size,
            num_blocks=num_blocks,
            kv_cache_memory=(
                cuda_budget(self.device, gpu_memory_utilization)
                if self.device.type == "cuda" and num_blocks is None
                else kv_cache_memory
            ),
            share=kv_cache_share,
            workers_per_machine=workers_per_machine,
            max_tokens=max_num_seqs * self.served_len,
        )
        self.pool_sizing: PoolSizing = self.size_pool()
        self._kv_cache: KVCache | None = None
        if not defer_pool:
            self.attach_pool()
        self.sampler = Sampler(cfg.vocab_size, self._eos_token_ids)
        tokenizer_source = Path(tokenizer) if tokenizer is not None else loaded.tokenizer_path
        self.constraints = RequestConstraints(tokenizer_source, cfg.vocab_size, self._eos_token_ids)
        self.requests: dict[str, RequestState] = {}
        # Requests computing their prompt's logprobs (sampling.prompt_logprobs); empty: no cost.
        self.prompt_tallies: dict[str, prompt_logprobs.PromptTally] = {}
        # Pooling requests (sampling.pooling mean/cls) folding their prompt's rows; empty: no cost.
        self.pool_tallies: dict[str, pooling.PoolTally] = {}
        # Speculative decoding: who proposes the tokens a decode's lookahead is filled with.
        # A draft model gets a pool of its own, as many blocks as the target's (its blocks are smaller:
        # fewer or narrower layers); it runs on this worker's backend, dtype and device.
        target = TargetFacts(
            cfg.vocab_size,
            tokenizer_source,
            backend,
            dtype,
            self.device,
            block_size,
            kv_dtype,
            self.pool_sizing.num_blocks,
            quantization,
            quant_activations,
        )
        self.proposer: Proposer | None = (
            make_proposer(speculative_config, target) if speculative_config else None
        )

    # ------------------------------------------------------------------ the KV pool

    def attach_pool(
        self, memory: mmap.mmap | None = None, offset: int = 0, num_blocks: int | None = None
    ) -> None:
        """Lay the pool out in `memory` from `offset` (a shared-memory segment; default private memory);
        `num_blocks`: a segment's own count, when it continues a pool sized before."""
        if num_blocks is not None and num_blocks != self.pool_sizing.num_blocks:
            self.pool_sizing = dataclasses.replace(self.pool_sizing, num_blocks=num_blocks)
        self._kv_cache = KVCache(self.kv_shape, self.pool_sizing.num_blocks, self.device, memory, offset)
        if self.ranks is not None:
            self.ranks.attach_pool(self.pool_sizing.num_blocks)  # the same block ids on every rank

    @property
    def kv_cache(self) -> KVCache:
        if self._kv_cache is None:
            raise RuntimeError("the KV pool is not attached yet (defer_pool): call attach_pool first")
        return self._kv_cache

    def kv_layout(self) -> dict[str, object]:
        """What a KV segment must have been written by to be continued here: same model and weights
        (quantized weights give other K/V than dense ones), same dtypes, same shape."""
        shape = self.kv_shape
        return {
            "format": 1,
            "model": str(self.model_path),
            "weights": self.runtime["weights"],
            "dtype": self.dtype,
            "kv_dtype": str(shape.dtype).removeprefix("torch."),
            "num_layers": shape.num_layers,
            "num_kv_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim,
            "block_size": shape.block_size,
            "num_blocks": self.pool_sizing.num_blocks,
        }

    # ------------------------------------------------------------------ what the worker reports

    @property
    def num_blocks(self) -> int:
        return self.pool_sizing.num_blocks

    @property
    def block_size(self) -> int:
        return self.kv_shape.block_size

    @property
    def vocab_size(self) -> int:
        return self._config.vocab_size

    @property
    def max_model_len(self) -> int:
        return self._config.max_model_len

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self._eos_token_ids)

    @property
    def model_config(self) -> ModelConfig:
        return self._config

    @property
    def runtime(self) -> dict[str, str]:
        """How this worker runs the model, for its start log and its announcements: the dtype, the
        attention backend, the linears' layout and the CPU ISA path of each C++ op."""
        from pagedserve.kernels.cpu.dispatch import kernel_paths

        layer_ops = self.model.layer_ops
        facts = {
            "dtype": self.dtype,
            "device": self.device.type,
            "attention_backend": self.attention_backend,
            "kv_cache_dtype": str(self.kv_shape.dtype).removeprefix("torch."),
            "layer_ops": "torch" if layer_ops is None else layer_ops.name,
            "linears": linears_kind(self.model),
            "weights": weights_kind(self.model, self.dtype),
            "dense_weights": dense_weights(self.model),  # `norms` once every matrix stays quantized
            "weight_layout": weight_layout(self.model),
            "quant_activations": quant_activations_kind(self.model),
        }
        if self.device.type == "cpu":
            facts.update({f"isa_{op}": path for op, path in kernel_paths().items()})
            facts["sampler"] = self.sampler.backend
        return facts

    # ------------------------------------------------------------------ one step

    def execute(self, step: Execute) -> StepResult:
        return self._execute(step, keep_logits=False)[0]

    def execute_with_logits(self, step: Execute) -> tuple[StepResult, torch.Tensor | None]:
        """For tests: also the logits [sampled rows, vocab] (parents' rows; forks reuse them)."""
        return self._execute(step, keep_logits=True)

    @torch.inference_mode()
    def _execute(self, step: Execute, keep_logits: bool) -> tuple[StepResult, torch.Tensor | None]:
        t_start = time.perf_counter()
        if self.loras is not None:  # adapters are read between steps, a slice at a time
            self.loras.take_prefetched(self.last_step_s)
            for name, path in step.prefetch_loras:
                self.loras.prefetch(name, path)
        result, logits = self._run(step, keep_logits, t_start)
        if self.step_rows >= RELEASE_AFTER_ROWS and self.device.type == "cpu":
            release_freed_heap()  # a big step's buffers: reused across its layers, not kept after it
        if self.loras is not None:
            result.loras_ready = self.loras.ready()
            result.loras_failed = self.loras.take_failures()
        self.last_step_s = result.timings["step_s"]  # every path of _run times itself
        return result, logits

    def _run(
        self, step: Execute, keep_logits: bool, t_start: float
    ) -> tuple[StepResult, torch.Tensor | None]:
        self.step_rows = 0  # until the batch is packed (a step may compute none)
        scheduled, lookahead = self._update_states(step)
        read_s = 0.0  # adapters read inside this step, before it is packed
        if self.loras is not None:
            named = {(s.lora_name, s.lora_path) for s, _ in scheduled if s.lora_name is not None}
            unreadable, read_s = self.loras.read_for_step(named)
            if unreadable:
                step, scheduled, lookahead = _leave_out(step, scheduled, lookahead, unreadable)
        if self.loras is not None and len(scheduled) > 1:
            scheduled, lookahead = _group_by_adapter(scheduled, lookahead)
        if step.copies:
            self._check_blocks("copy-on-write", [b for pair in step.copies for b in pair])
            self.kv_cache.copy_blocks(step.copies)
        if not scheduled:
            if step.forks:
                raise ValueError(f"step {step.step} forks requests but computes no tokens")
            if self.ranks is not None and step.copies:
                self.ranks.forward(step.copies, None)
            return StepResult(step.step, timings={"step_s": time.perf_counter() - t_start}), None
        proposed = self._propose(scheduled, lookahead) if lookahead else {}
        batch = pack_batch(scheduled, self.block_size, self.device, proposed)
        self.step_rows = len(batch.input_ids)
        lora_load_s = read_s
        if self.loras is not None:  # rows per request: its tokens and any proposed ones
            lora_load_s += self.loras.rows_for_step(
                step.step,
                [
                    (s.lora_name, s.lora_path, n + len(proposed.get(i, ())))
                    for i, (s, n) in enumerate(scheduled)
                ],
            )
        self.prefilling = any(n > 1 for _state, n in scheduled)
        long_tokens = self._long_tokens(scheduled, proposed, batch)
        t_forward = time.perf_counter()
        if self.ranks is not None:  # the other ranks run the same forward on their heads
            self.ranks.forward(step.copies, forward_batch(batch, long_tokens))
        hidden = self.model(batch.input_ids, batch.positions, self.kv_cache.layers(), batch.meta, long_tokens)
        # Each request's rows in the packed batch: its scheduled tokens, then any proposals after them.
        scored = [(s, n + len(proposed.get(i, ()))) for i, (s, n) in enumerate(scheduled)]
        if self.prompt_tallies:
            prompt_logprobs.collect(self.prompt_tallies, scored, hidden, self.model.compute_logits)
        if self.pool_tallies:
            pooling.collect(self.pool_tallies, scored, hidden)
        for state, n in scheduled:
            state.num_computed_tokens += n  # a speculating decode adds its accepted proposals later
        logits = self.model.compute_logits(hidden[batch.logits_indices]) if batch.sample_rows else None
        if proposed:
            failpoints.fire("worker.mid_verification")  # the KV of proposals is written, none judged yet
        t_sample = time.perf_counter()
        result = self._sample(step, scheduled, batch, logits, proposed)
        if batch.pool_rows:
            result.pooled = pooling.pooled_outputs(
                [scheduled[row][0] for row in batch.pool_rows],
                hidden[torch.tensor(batch.pool_indices, device=hidden.device)],
                self.pool_tallies,
                self.model.compute_logits,
            )
        t_end = time.perf_counter()
        result.timings = {
            "prepare_s": t_forward - t_start,
            "forward_s": t_sample - t_forward,
            "sample_s": t_end - t_sample,
            "step_s": t_end - t_start,
        }
        if self.loras is not None:  # the live view and /metrics: adapters per step, loads
            result.timings["lora_adapters"] = float(len(self.loras.batch.groups))
            if lora_load_s:
                result.timings["lora_load_s"] = lora_load_s
        return result, logits if keep_logits else None

    def _update_states(self, step: Execute) -> tuple[list[tuple[RequestState, int]], dict[int, int]]:
        """Steps 1-2: forget finished requests, add new ones, extend running ones. Also the lookahead
        granted to decodes (index into the scheduled list -> most proposals)."""
        for request_id in step.finished_ids:
            state = self.requests.pop(request_id, None)
            self.prompt_tallies.pop(request_id, None)
            self.pool_tallies.pop(request_id, None)
            if state is not None and self.proposer is not None:
                self.proposer.finished(state)
        scheduled: list[tuple[RequestState, int]] = []
        lookahead: dict[int, int] = {}
        for new in step.new_requests:
            self._check_blocks(new.request_id, new.block_ids)
            state = RequestState(
                request_id=new.request_id,
                prompt_token_ids=new.token_ids[: new.num_prompt_tokens],
                output_token_ids=new.token_ids[new.num_prompt_tokens :],
                num_computed_tokens=new.num_computed_tokens,
                block_ids=list(new.block_ids),
                sampling=new.sampling,
                lora_name=new.lora_name,
                lora_path=new.lora_path,
                num_tokens_at_start=len(new.token_ids),
            )
            if new.lora_name is not None and self.loras is None:
                raise ValueError(
                    f"{new.request_id!r} asks for LoRA adapter {new.lora_name!r}; this worker has LoRA off"
                )
            earlier = self.requests.get(new.request_id)
            if earlier is not None and self.proposer is not None:
                self.proposer.finished(earlier)  # restarted without a forget: its draft KV goes back
            self.requests[new.request_id] = state
            if (tally := prompt_logprobs.wanted(state)) is not None:
                self.prompt_tallies[new.request_id] = tally
            if (pool := pooling.wanted(state)) is not None:
                self.pool_tallies[new.request_id] = pool
            if new.num_scheduled_tokens:
                scheduled.append((state, new.num_scheduled_tokens))
        for cached in step.cached_requests:
            state = self.requests.get(cached.request_id)
            if state is None:
                raise KeyError(
                    f"step {step.step} names request {cached.request_id!r}, which this worker does not hold"
                )
            if cached.new_block_ids:
                self._check_blocks(cached.request_id, cached.new_block_ids)
                state.block_ids += cached.new_block_ids
            for index, block_id in cached.replaced_blocks:
                self._check_blocks(cached.request_id, [block_id])
                state.block_ids[index] = block_id
            if cached.num_scheduled_tokens:
                if cached.num_lookahead:
                    lookahead[len(scheduled)] = cached.num_lookahead
                scheduled.append((state, cached.num_scheduled_tokens))
        return scheduled, lookahead

    def _propose(
        self, scheduled: list[tuple[RequestState, int]], lookahead: dict[int, int]
    ) -> dict[int, list[int]]:
        """Proposed tokens of the decodes granted lookahead (none without a proposer)."""
        proposer = self.proposer
        if proposer is None:
            return {}
        proposed: dict[int, list[int]] = {}
        # Only a decode of the last known token: its inputs end where the proposals begin.
        rows = [
            (row, k)
            for row, k in lookahead.items()
            if scheduled[row][1] == 1
            and scheduled[row][0].num_computed_tokens + 1 == scheduled[row][0].num_tokens
        ]
        made = propose_all(proposer, [(scheduled[row][0], k) for row, k in rows])
        for (row, k), tokens in zip(rows, made, strict=True):
            state = scheduled[row][0]
            tokens = tokens[:k]
            if tokens and state.sampling.structured_outputs is not None:
                tokens = tokens[: self.constraints.allowed_prefix(state, tokens)]
            if tokens:
                proposed[row] = tokens
        return proposed

    def _sample(
        self,
        step: Execute,
        scheduled: list[tuple[RequestState, int]],
        batch: PackedBatch,
        logits: torch.Tensor | None,
        proposed: dict[int, list[int]],
    ) -> StepResult:
        """Steps 5-6: the tokens of each request that reached its end (one, or for a decode with
        proposals, the accepted ones and the token after them), then one per fork child."""
        scored: list[ScoredRequest] = []
        first_row = 0
        for row in batch.sample_rows:
            tokens = proposed.get(row, [])
            scored.append(ScoredRequest(scheduled[row][0], tokens, first_row))
            first_row += 1 + len(tokens)
        requests = sampling_rows(scored)
        children = [self._fork(step, fork, scored) for fork in step.forks]
        if logits is None:
            return StepResult(step.step)
        rows = logits
        if children:
            # A child samples from its parent's logits row with its own params (seed), before
            # either has the parent's new token appended.
            parent_rows = [row for _child, row in children]
            rows = torch.cat([logits, logits[torch.tensor(parent_rows, device=logits.device)]])
            requests += [
                SamplingRequest(c.sampling, c.prompt_token_ids, c.output_token_ids) for c, _ in children
            ]
        mask = self.constraints.mask_rows(
            [(item.state, item.proposed) for item in scored] + [(c, []) for c, _ in children]
        )
        tokens, logprobs = self.sampler.sample(rows, requests, mask)
        step_logprobs: list[Any] | None = None if logprobs is None else []  # the result's, built below
        result = StepResult(step.step, logprobs=step_logprobs)
        for item in scored:
            state, at, p = item.state, item.first_row, len(item.proposed)
            m = accepted_run(tokens[at : at + 1 + p], item.proposed) if p else 0
            self._append(state, tokens[at : at + m + 1])
            state.num_computed_tokens += m  # the accepted proposals' KV was written in this forward
            result.request_ids.append(state.request_id)
            result.token_ids.append(tokens[at])
            if step_logprobs is not None and logprobs is not None:
                step_logprobs.append(logprobs[at])
            if p:
                more_lps = logprobs[at + 1 : at + m + 1] if logprobs is not None and logprobs[at] else None
                result.speculation.append(
                    Speculated(len(result.request_ids) - 1, p, tokens[at + 1 : at + m + 1], more_lps)
                )
        for at, (child, _row) in enumerate(children, first_row):  # their rows follow every scored row
            self._append(child, [tokens[at]])
            self.requests[child.request_id] = child
            result.request_ids.append(child.request_id)
            result.token_ids.append(tokens[at])
            if step_logprobs is not None and logprobs is not None:
                step_logprobs.append(logprobs[at])
        if self.prompt_tallies:
            result.prompt_logprobs = prompt_logprobs.take_finished(
                self.prompt_tallies, [item.state for item in scored]
            )
        return result

    @staticmethod
    def _append(state: RequestState, tokens: list[int]) -> None:
        state.output_token_ids += tokens
        if state.matcher is not None:
            for token in tokens:
                state.matcher.accept(token)

    def _fork(self, step: Execute, fork: Fork, sampled: list[ScoredRequest]) -> tuple[RequestState, int]:
        """A copy of the parent as it stands before this step's token, and the parent's logits row."""
        rows = [item for item in sampled if item.state.request_id == fork.parent_id]
        if not rows:
            raise ValueError(
                f"step {step.step} forks {fork.child_id!r} from {fork.parent_id!r}, which samples nothing this step"
            )
        row = rows[0].first_row
        parent = rows[0].state
        child = RequestState(
            request_id=fork.child_id,
            prompt_token_ids=parent.prompt_token_ids,  # never modified: shared
            output_token_ids=list(parent.output_token_ids),
            num_computed_tokens=parent.num_computed_tokens,
            block_ids=list(parent.block_ids),  # shared with the parent; copy-on-write comes later
            sampling=parent.sampling.with_seed(fork.seed),
            lora_name=parent.lora_name,
            lora_path=parent.lora_path,
            num_tokens_at_start=parent.num_tokens_at_start,
        )
        # The child's grammar state is the parent's before this step's token (it samples its own).
        child.matcher = self.constraints.fork(parent)
        return child, row

    def _long_tokens(
        self, scheduled: list[tuple[RequestState, int]], proposed: dict[int, list[int]], batch: PackedBatch
    ) -> torch.Tensor | None:
        """LongRoPE models: the packed tokens (each request's rows, its proposals included) rotated with
        the long factors (layers/rope.py); else None."""
        long_from = self.model.rotary.long_from
        if long_from is None:
            return None
        scored = [(s, n + len(proposed.get(i, ()))) for i, (s, n) in enumerate(scheduled)]
        starts = [state.num_tokens_at_start for state, _ in scored]
        return longrope_tokens(batch.positions, starts, [n for _, n in scored], long_from)

    def _check_blocks(self, owner: str, block_ids: list[int]) -> None:
        # A negative id would silently read another block; past the end it is a device assert on CUDA.
        if block_ids and (min(block_ids) < 0 or max(block_ids) >= self.num_blocks):
            raise ValueError(f"{owner!r}: block ids must be in [0, {self.num_blocks}); got {block_ids}")


def _leave_out(
    step: Execute,
    scheduled: list[tuple[RequestState, int]],
    lookahead: dict[int, int],
    unreadable: set[tuple[str, str | None]],
) -> tuple[Execute, list[tuple[RequestState, int]], dict[int, int]]:
    """The requests whose adapter cannot be read (its files broke after the load) leave this step,
    with any fork of them: they compute nothing and write no K/V. The failure goes out with the
    result (StepResult.loras_failed) and the scheduler ends them; the step goes on for the rest."""
    keep = [i for i, (s, _) in enumerate(scheduled) if (s.lora_name, s.lora_path) not in unreadable]
    left_out = {s.request_id for s, _ in scheduled if (s.lora_name, s.lora_path) in unreadable}
    moved = {old: new for new, old in enumerate(keep)}
    forks = [f for f in step.forks if f.parent_id not in left_out]
    return (
        msgspec.structs.replace(step, forks=forks),
        [scheduled[i] for i in keep],
        {moved[old]: k for old, k in lookahead.items() if old in moved},
    )


def _group_by_adapter(
    scheduled: list[tuple[RequestState, int]], lookahead: dict[int, int]
) -> tuple[list[tuple[RequestState, int]], dict[int, int]]:
    """The same requests with each adapter's rows side by side (base rows first, then by adapter
    name, stable), so every LoRA linear takes each adapter's rows as one slice: two GEMMs per adapter
    instead of a gather and a scatter around them. Results go by request id, so order is free."""
    order = sorted(range(len(scheduled)), key=lambda i: scheduled[i][0].lora_name or "")
    if order == list(range(len(scheduled))):
        return scheduled, lookahead
    moved = {old: new for new, old in enumerate(order)}
    return [scheduled[i] for i in order], {moved[old]: k for old, k in lookahead.items()}


def weights_kind(model: torch.nn.Module, dtype: str) -> str:
    """The weight types in use: `gguf Q4_1x210 Q8_0x1 + float32` (quantized linears and embedding by
    source format and type, e.g. `gptq Q4_1x14` for GPTQ repacked to Q4_1, then the dense rest) or
    the dtype alone."""
    types = weight_types(model)
    if not types:
        return dtype
    sources = sorted({source for source, _ in types})
    listed = [
        source + " " + " ".join(f"{t}x{n}" for (s, t), n in sorted(types.items()) if s == source)
        for source in sources
    ]
    return " ".join(listed) + f" + {dtype}"
