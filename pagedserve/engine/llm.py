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

from pagedserve.engine.engine import Engine
from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.services.checkpoint import load_checkpoint, load_tokenizer
from pagedserve.services.scheduler.admission import check_request
from pagedserve.services.scheduler.scheduler import RequestDone, Scheduler, SchedulerLimits
from pagedserve.shared.config import ServeConfig, config_default
from pagedserve.shared.protocol.frontend import CompletionOutput, SamplingParams
from pagedserve.shared.protocol.prompt_logprobs import PromptLogprobs
from tqdm import tqdm


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    prompt_logprobs: PromptLogprobs | None = None  # SamplingParams.prompt_logprobs asked for them

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
    def __init__(
        self,
        model: str = "smollm2-135m",
        *,
        block_size: int = config_default("block_size"),
        num_blocks: int | None = None,
        kv_cache_memory: int = config_default("kv_cache_memory"),
        pipeline_depth: int = config_default("pipeline_depth"),
        max_num_seqs: int = config_default("max_num_seqs"),
        max_num_batched_tokens: int = config_default("max_num_batched_tokens"),
        max_model_len: int | None = None,
        aging_s: float = config_default("aging_s"),
        dtype: str = config_default("dtype"),
        device: str = config_default("device"),
        attention_backend: str = config_default("attention_backend"),
        enable_prefix_caching: bool = config_default("enable_prefix_caching"),
        quantization: str = config_default("quantization"),
        speculative_config: dict | str | None = None,
    ) -> None:
        from pagedserve.services.worker.runner import ModelRunner

        # Validate through the same model the services use: one vocabulary, one set of limits.
        config = ServeConfig(
            model=model,
            block_size=block_size,
            num_blocks=num_blocks,
            kv_cache_memory=kv_cache_memory,
            pipeline_depth=pipeline_depth,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            aging_s=aging_s,
            dtype=dtype,
            device=device,
            attention_backend=attention_backend,
            enable_prefix_caching=enable_prefix_caching,
            quantization=quantization,
            speculative_config=speculative_config,
        )
        checkpoint = load_checkpoint(model)
        self.tokenizer = load_tokenizer(checkpoint.tokenizer_path)
        self.runner = ModelRunner(
            checkpoint.path,
            dtype=dtype,
            device=device,
            block_size=block_size,
            num_blocks=num_blocks,
            kv_cache_memory=kv_cache_memory,
            attention_backend=attention_backend,
            quantization=config.quantization,
            speculative_config=config.speculative_config,
        )
        self.max_model_len = checkpoint.served_len(max_model_len)
        limits = SchedulerLimits.from_config(config, self.max_model_len)
        self.block_manager = BlockManager(enable_prefix_caching=enable_prefix_caching)
        self.scheduler = Scheduler(limits, self.runner.eos_token_ids, self.tokenizer, owner="llm")
        self.engine = Engine(self.scheduler, self.block_manager, self.runner)
        self._ids = itertools.count()

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
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the order of `prompts`."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("prompts must be a list of strings or a list of token-id lists")
        if params is None:
            params = SamplingParams()
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"got {len(per_prompt)} SamplingParams for {len(prompts)} prompts")
        ids: list[str] = []
        token_lists: dict[str, list[int]] = {}
        now = time.monotonic()
        for prompt, sp in zip(prompts, per_prompt, strict=True):
            tokens = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
            check_request(tokens, sp, self.max_model_len, self.runner.vocab_size, self.tokenizer is not None)
            rid = f"llm-{next(self._ids)}"
            self.scheduler.add_request(rid, tokens, sp, now)
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
        )
