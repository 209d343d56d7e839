"""What bounds the scheduler (from ServeConfig), and what it counts while it runs."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.shared.config import ServeConfig, config_default
from pagedserve.shared.paging import blocks_for
from pagedserve.shared.speculative_config import SpeculativeConfig


@dataclass(slots=True)
class SchedulerLimits:
    max_num_seqs: int = config_default("max_num_seqs")
    max_num_batched_tokens: int = config_default("max_num_batched_tokens")
    aging_s: float = config_default("aging_s")
    pipeline_depth: int = config_default("pipeline_depth")
    # The model's context (capped by ServeConfig.max_model_len), which from_config always passes.
    max_model_len: int = 2048
    # Blocks kept free when admitting, so running decodes can grow without preempting at once.
    watermark_blocks: int = 1
    speculative: SpeculativeConfig | None = None  # speculative decoding: off when None

    @classmethod
    def from_config(cls, config: ServeConfig, max_model_len: int) -> SchedulerLimits:
        return cls(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            aging_s=config.aging_s,
            pipeline_depth=config.pipeline_depth,
            max_model_len=max_model_len,
            speculative=config.speculative_config,
        )


@dataclass(slots=True)
class SchedulerStats:
    steps: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    kv_slots_used: int = 0  # summed over steps: token slots holding KV
    kv_slots_held: int = 0  # summed over steps: slots of the blocks those requests hold
    # Speculative decoding: tokens proposed and accepted, and decodes that were granted lookahead.
    spec_proposed: int = 0
    spec_accepted: int = 0
    spec_decodes: int = 0

    @property
    def spec_acceptance(self) -> float:
        return self.spec_accepted / self.spec_proposed if self.spec_proposed else 0.0

    def account_kv(self, num_slots_used: list[int], block_size: int) -> None:
        """One step's KV use: slots holding tokens against the slots of the blocks they occupy."""
        self.kv_slots_used += sum(num_slots_used)
        self.kv_slots_held += sum(blocks_for(n, block_size) for n in num_slots_used) * block_size

    @property
    def kv_utilization(self) -> float:
        return self.kv_slots_used / self.kv_slots_held if self.kv_slots_held else 0.0
