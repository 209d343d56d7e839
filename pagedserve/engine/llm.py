"""`LLM`: offline batch generation on the in-process engine.

from pagedserve import LLM, SamplingParams
llm = LLM(model="smollm2-135m")
out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))
print(out[0].text)
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from pagedserve.engine.engine import Engine
from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.services.checkpoint import load_checkpoint, load_tokenizer
from pagedserve.services.scheduler.admission import check_request
from pagedserve.services.scheduler.scheduler import RequestDone, Scheduler, SchedulerLimits
from pagedserve.services.worker.kv_budget import check_fits
from pagedserve.shared.config import config_of
from pagedserve.shared.lora_modules import parse_lora_modules
from pagedserve.shared.protocol.frontend import CompletionOutput, SamplingParams
from pagedserve.shared.protocol.pooling import PoolingParams, unpack_floats
from pagedserve.shared.protocol.prompt_logprobs import PromptLogprobs


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    prompt_logprobs: PromptLogprobs | None = None  # SamplingParams.prompt_logprobs asked for them
    pooled: bytes | None = None  # SamplingParams.pooling: the vector (float32, little-endian)

    @property
    def vector(self) -> list[float]:
        """A pooling request's vector: an embedding, or the logits of pooling.token_ids."""
        if self.pooled is None:
            raise ValueError(f"request {self.request_id!r} asked for no pooling: it has no vector")
        return unpack_floats(self.pooled)

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str:
        return self.outputs[0].finish_reason


class LLM:
    def __init__(self, model: str = "smollm2-135m", **overrides: Any) -> None:
        """Any `ServeConfig` field as a keyword (`LLM(model, dtype="bfloat16", max_loras=4)`), validated
        as a deployment's configuration is (a wrong name or value: pydantic's ValidationError naming the
        field), from the fields' declared defaults, never the PAGEDSERVE_* environment. Fields only a
        deployment's processes read (endpoints, the API, timeouts) are accepted and change nothing here.
        max_loras > 0 enables LoRA adapters (that many per step); lora_modules (name -> PEFT folder, or
        the CLI's "name=path" strings) are served from the start (more with load_lora)."""
        from pagedserve.services.worker.runner import ModelRunner

        loras = overrides.get("lora_modules")
        if isinstance(loras, dict):
            overrides["lora_modules"] = [f"{name}={path}" for name, path in loras.items()]
        config = config_of(model=model, **overrides)
        if config.tensor_parallel_size > 1:  # its other ranks are processes a worker starts and watches
            raise ValueError(
                f"tensor_parallel_size {config.tensor_parallel_size} needs a deployment (pagedserve up / "
                "worker): the in-process engine runs one process"
            )
        tokenizer, max_model_len = config.tokenizer, config.max_model_len
        checkpoint = load_checkpoint(model, tokenizer)
        self.tokenizer = load_tokenizer(checkpoint.tokenizer_path)
        self.runner = ModelRunner.from_config(checkpoint.path, config, tokenizer=checkpoint.tokenizer_path)
        self.max_model_len = checkpoint.served_len(max_model_len)
        check_fits(self.runner.pool_sizing, self.max_model_len)
        limits = SchedulerLimits.from_config(config, self.max_model_len, checkpoint.rope_switch_at)
        self.block_manager = BlockManager(enable_prefix_caching=config.enable_prefix_caching)
        self.scheduler = Scheduler(limits, self.runner.eos_token_ids, self.tokenizer, owner="llm")
        self.engine = Engine(self.scheduler, self.block_manager, self.runner)
        self._ids = itertools.count()
        for name, path in parse_lora_modules(config.lora_modules):
            self.load_lora(name, path)

    def load_lora(self, name: str, path: str) -> None:
        """Serve the PEFT adapter at `path` as `name` (checked against the model now: ValueError
        naming the file or module, and nothing changes)."""
        loras = self.runner.loras
        if loras is None:
            raise ValueError("LoRA is off: construct LLM with max_loras >= 1")
        module = self.scheduler.loras.add(name, path)
        try:
            loras.load(name, module.path)
        except ValueError:
            self.scheduler.loras.remove(name)
            raise

    def unload_lora(self, name: str) -> None:
        """Stop serving adapter `name` (ValueError while a live request uses it: generate is synchronous,
        so none does between calls)."""
        users = self.scheduler.lora_users(name)
        if users:
            raise ValueError(f"LoRA adapter {name!r} is in use by {', '.join(users)}")
        self.scheduler.loras.remove(name)
        if self.runner.loras is not None:
            self.runner.loras.unload(name)

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass prompts as lists of token ids")
        return self.tokenizer.encode(prompt)

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool | None = None,
        lora: str | Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the order of `prompts`. lora: the adapter
        (by name) of every prompt, or one per prompt (None: the base model)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("prompts must be a list of strings or a list of token-id lists")
        if params is None:
            params = SamplingParams()
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"got {len(per_prompt)} SamplingParams for {len(prompts)} prompts")
        loras = [lora] * len(prompts) if lora is None or isinstance(lora, str) else list(lora)
        if len(loras) != len(prompts):
            raise ValueError(f"got {len(loras)} lora names for {len(prompts)} prompts")
        modules = []
        for name in loras:
            module = None if name is None else self.scheduler.loras.get(name)
            if name is not None and module is None:
                raise ValueError(
                    f"lora: no LoRA adapter named {name!r} is loaded ({self.scheduler.loras.names()})"
                )
            modules.append(module)
        ids: list[str] = []
        token_lists: dict[str, list[int]] = {}
        now = time.monotonic()
        for prompt, sp, module in zip(prompts, per_prompt, modules, strict=True):
            tokens = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
            check_request(tokens, sp, self.max_model_len, self.runner.vocab_size, self.tokenizer is not None)
            rid = f"llm-{next(self._ids)}"
            self.scheduler.add_request(rid, tokens, sp, now, lora=module)
            ids.append(rid)
            token_lists[rid] = tokens
        done: dict[str, RequestOutput] = {}
        show = use_tqdm if use_tqdm is not None else len(prompts) >= 8
        with tqdm(total=len(ids), desc="generate", disable=not show, unit="req") as bar:
            while len(done) < len(ids):
                for event in self.engine.step():
                    if isinstance(event, RequestDone):
                        done[event.request_id] = self._to_output(event, token_lists[event.request_id])
                        bar.update(1)
        self.engine.flush()
        return [done[rid] for rid in ids]

    def embed(
        self, prompts: Sequence[str] | Sequence[Sequence[int]], pooling: PoolingParams | None = None
    ) -> list[list[float]]:
        """One pooled vector per prompt (prefill only; `pooling` defaults to last-token pooling)."""
        params = SamplingParams(max_tokens=1, pooling=pooling or PoolingParams())
        outputs = self.generate(prompts, params)
        for out in outputs:
            if out.error is not None:
                raise RuntimeError(f"request {out.request_id}: {out.error}")
        return [out.vector for out in outputs]

    @staticmethod
    def _to_output(done: RequestDone, prompt: list[int]) -> RequestOutput:
        outputs = done.completion_outputs("error")
        return RequestOutput(
            done.request_id,
            prompt,
            outputs,
            done.num_cached_tokens,
            done.error_code,
            prompt_logprobs=done.prompt_logprobs,
            pooled=done.pooled,
        )
