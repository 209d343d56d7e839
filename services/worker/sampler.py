"""Token sampling for one packed step: one token per row of logits, batched over rows.

Processing order: penalties -> logit_bias -> min_tokens mask -> constraint mask -> logprobs are read
here -> temperature -> top-k -> top-p -> min-p -> draw. Greedy rows (temperature 0) take the argmax
after the masks. The constraint mask (a packed bitmask for the constrained rows only, from their
grammar matchers) sets forbidden tokens to -inf before either backend runs, so the C++ op and the
torch path both see it; a step without constrained rows does no work for it.

Logprobs describe the model's distribution as the request sees it before any sampling choice: the
log-softmax of the logits after penalties and the min_tokens mask, before temperature and truncation
(vLLM's convention). So a greedy and a sampled request report the same numbers for the same logits.

Draws use the inverse CDF: one uniform per row, searched in the running sum of the kept tokens'
weights in vocabulary order (a vectorised torch.multinomial, one random number a row instead of one
per token). Seeded rows take their uniform from their own generator seeded by (seed, number of tokens
generated so far), so a seed gives the same tokens whatever else shares the batch, and again after
preemption and recompute. Unseeded rows share one generator.

Two backends draw with these semantics: on the CPU a C++ op (kernels/cpu/sampling.cpp: two or three
passes over each row, float32 or bfloat16 logits read in place), elsewhere, or where that op cannot
be built, torch ops (truncation.py). `backend="auto"` takes the op when it builds. The op and the
torch path agree up to float rounding (tests/unit/sampler), not bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pagedserve.kernels.cpu.build import SAMPLING, KernelBuildError, load_extension
from pagedserve.kernels.cpu.dispatch import kernel_paths, load_ops, note_torch_path
from pagedserve.kernels.cpu.isa import check_isa
from pagedserve.services.worker.penalties import apply_penalties, mask_tokens
from pagedserve.services.worker.sampling_batch import SamplingBatch, build_sampling_batch, column
from pagedserve.services.worker.truncation import min_p_floor, top_k_top_p_floor
from pagedserve.shared.protocol.step import WorkerSampling

if TYPE_CHECKING:
    from pagedserve.services.constraints.matcher import TokenMask

_SEED_MASK = (1 << 63) - 1


@dataclass(slots=True)
class SamplingRequest:
    params: WorkerSampling
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]


def row_seed(seed: int, position: int) -> int:
    """The generator seed of a seeded row's draw for its `position`-th output token."""
    return (seed * 1_000_003 + position) & _SEED_MASK


def _sampling_ops(isa: str | None):
    """The op's torch.ops namespace: the best ISA path that builds (or the one PAGEDSERVE_CPU_ISA
    forces), or exactly `isa`. Built once per machine and cached; loaded in milliseconds after that."""
    return load_ops(SAMPLING) if isa is None else load_extension(SAMPLING, check_isa(isa))


def resolve_backend(name: str, isa: str | None = None) -> str:
    """`auto` -> `cpp` if the C++ op builds here (else `torch`; the loader logs why), `cpp` raises
    KernelBuildError if it cannot be built. `isa` asks for one ISA path of the op (tests)."""
    if name not in ("auto", "cpp", "torch"):
        raise ValueError(f"sampler backend must be one of auto, cpp, torch; got {name!r}")
    if name == "torch":
        note_torch_path(SAMPLING)
        return name
    try:
        _sampling_ops(isa)
    except KernelBuildError:
        if name == "cpp":
            raise
        return "torch"  # still correct, only slower
    return "cpp"


class Sampler:
    def __init__(
        self, vocab_size: int, eos_token_ids: Sequence[int], backend: str = "auto", isa: str | None = None
    ) -> None:
        """`isa` (avx512, avx2, portable): run that path of the C++ op rather than the best one."""
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.backend = resolve_backend(backend, isa)
        self._sample_rows = _sampling_ops(isa).sample_rows.default if self.backend == "cpp" else None
        # The ISA path the op runs (None on the torch backend).
        self.isa = (isa or kernel_paths()[SAMPLING.name]) if self.backend == "cpp" else None
        self._shared_generator = torch.Generator()  # unseeded rows promise nothing: seeded from the OS
        self._shared_generator.seed()

    def sample(
        self, logits: torch.Tensor, requests: Sequence[SamplingRequest], mask: TokenMask | None = None
    ) -> tuple[list[int], list[Any] | None]:
        """logits [len(requests), vocab] (any float dtype) -> one token per row, and per-row logprobs
        (None for rows that did not ask; the whole list None when no row asked). `mask`: the tokens
        each constrained row may take (every other token of that row gets -inf)."""
        if logits.shape[0] != len(requests):
            raise ValueError(f"logits has {logits.shape[0]} rows for {len(requests)} requests")
        if logits.shape[1] < self.vocab_size:
            raise ValueError(f"logits has {logits.shape[1]} columns, vocab_size is {self.vocab_size}")
        logits = logits[:, : self.vocab_size]  # padded vocab columns are never tokens
        batch = build_sampling_batch(requests, self.eos_token_ids, self.vocab_size)
        on_kernel = self.backend == "cpp" and logits.device.type == "cpu"
        if batch.is_plain_greedy and mask is None and not on_kernel:
            return logits.argmax(dim=1).tolist(), None

        if batch.penalised_rows or batch.banned or batch.biased or mask is not None:
            # Penalties and the masks write in place: on a copy, so the caller's logits stay as they were.
            logits = logits.to(torch.float32, copy=True)
            self._penalise(logits, batch, requests)
            for row, ids, values in batch.biased:
                logits[row, ids] += torch.tensor(values, dtype=logits.dtype, device=logits.device)
            mask_tokens(logits, batch.banned)
            if mask is not None:
                from pagedserve.services.constraints.matcher import apply_mask

                apply_mask(logits, mask)
        if on_kernel:
            tokens = self._kernel_tokens(logits, batch)
        else:
            logits = logits.to(torch.float32)
            tokens = torch.empty(batch.num_rows, dtype=torch.long, device=logits.device)
            if batch.greedy_rows:
                tokens[batch.greedy_rows] = _rows(logits, batch.greedy_rows).argmax(dim=1)
            if batch.random_rows:
                tokens[batch.random_rows] = self._draw(_rows(logits, batch.random_rows), batch)
        return tokens.tolist(), _logprobs(logits, tokens, batch)

    def _kernel_tokens(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """Every row's token in one call of the C++ op: greedy rows have inverse temperature 0."""
        if logits.dtype not in (torch.float32, torch.bfloat16):
            logits = logits.to(torch.float32)
        if logits.stride(1) != 1:
            logits = logits.contiguous()
        assert self._sample_rows is not None  # only the cpp backend calls _kernel_tokens
        rows, at = batch.num_rows, batch.random_rows
        uniforms = torch.zeros(rows)
        if at:
            uniforms[at] = self._uniforms(batch.seeds, batch.positions)
        return self._sample_rows(
            logits,
            torch.tensor(_spread([1.0 / t for t in batch.temperatures], at, rows, 0.0), dtype=torch.float32),
            uniforms,
            torch.tensor(_spread(batch.top_ks, at, rows, 0), dtype=torch.long),
            torch.tensor(_spread(batch.top_ps, at, rows, 1.0), dtype=torch.float32),
            torch.tensor(_spread(batch.min_ps, at, rows, 0.0), dtype=torch.float32),
        )

    def _penalise(
        self, logits: torch.Tensor, batch: SamplingBatch, requests: Sequence[SamplingRequest]
    ) -> None:
        if not batch.penalised_rows:
            return
        chosen = [requests[i] for i in batch.penalised_rows]
        rows = _rows(logits, batch.penalised_rows)  # a copy unless it is every row
        apply_penalties(
            rows,
            prompt_ids=[r.prompt_token_ids for r in chosen],
            output_ids=[r.output_token_ids for r in chosen],
            repetition=[r.params.repetition_penalty for r in chosen],
            presence=[r.params.presence_penalty for r in chosen],
            frequency=[r.params.frequency_penalty for r in chosen],
        )
        if rows is not logits:
            logits[batch.penalised_rows] = rows

    def _draw(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """One token per row of `logits` (the random rows, in batch.random_rows order)."""
        device, dtype = logits.device, logits.dtype
        scaled = logits / column(batch.temperatures, device, dtype)
        floor: torch.Tensor | None = None
        if batch.any_truncation:
            top_k = torch.tensor(batch.top_ks, device=device)
            floor = top_k_top_p_floor(scaled, top_k, torch.tensor(batch.top_ps, device=device, dtype=dtype))
        if batch.any_min_p:
            by_min_p = min_p_floor(scaled, torch.tensor(batch.min_ps, device=device, dtype=dtype))
            floor = by_min_p if floor is None else torch.maximum(floor, by_min_p)

        # Inverse CDF: unnormalised weights, their running sum, and one uniform per row scaled to the total.
        dropped = None if floor is None else scaled < floor.unsqueeze(1)
        weights = scaled.sub_(scaled.amax(dim=1, keepdim=True)).exp_()  # scaled is ours: reuse its memory
        if dropped is not None:
            weights.masked_fill_(dropped, 0.0)
        cdf = weights.cumsum_(dim=1)
        total = cdf[:, -1:]
        target = self._uniforms(batch.seeds, batch.positions).to(device, dtype).unsqueeze(1) * total
        # Strictly below the total, so the search lands on a token with weight: flat steps are never hit.
        target = torch.minimum(target, total.nextafter(torch.zeros_like(total)))
        tokens = torch.searchsorted(cdf, target, right=True).squeeze(1)
        return tokens.clamp_max_(self.vocab_size - 1)

    def _uniforms(self, seeds: Sequence[int | None], positions: Sequence[int]) -> torch.Tensor:
        """One U[0, 1) per row, on the CPU: a seeded row's comes from its own (seed, position)
        generator, so it is the same alone, in any batch, and on any device."""
        uniforms = torch.rand(len(seeds), generator=self._shared_generator)
        for i, (seed, position) in enumerate(zip(seeds, positions, strict=True)):
            if seed is not None:
                generator = torch.Generator().manual_seed(row_seed(seed, position))
                uniforms[i] = torch.rand(1, generator=generator)
        return uniforms


def _spread(values: Sequence[float | int], at: list[int], rows: int, fill: float | int) -> list[float | int]:
    """One value per row: values[j] at row at[j], `fill` (the rule's "off") everywhere else."""
    if len(at) == rows:
        return list(values)  # at is every row, in order
    spread: list[float | int] = [fill] * rows
    for row, value in zip(at, values, strict=True):
        spread[row] = value
    return spread


def _rows(tensor: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """tensor[rows] without a gather when `rows` is every row (the common, uniform batch)."""
    return tensor if len(rows) == tensor.shape[0] else tensor[rows]


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, batch: SamplingBatch) -> list[Any] | None:
    """Per row None, or [sampled token's logprob, [[token_id, logprob], ...top-n, best first]]."""
    if not batch.logprob_rows:
        return None
    logprobs = _rows(logits, batch.logprob_rows).to(torch.float32).log_softmax(dim=1)
    sampled = logprobs.gather(1, _rows(tokens, batch.logprob_rows).unsqueeze(1)).squeeze(1).tolist()
    most = max(batch.num_logprobs)
    top_values, top_ids = logprobs.topk(most, dim=1) if most > 0 else (logprobs[:, :0], logprobs[:, :0])
    top_values, top_ids = top_values.tolist(), top_ids.long().tolist()
    result: list[Any] = [None] * batch.num_rows
    for j, (row, n) in enumerate(zip(batch.logprob_rows, batch.num_logprobs, strict=True)):
        result[row] = [sampled[j], [[top_ids[j][i], top_values[j][i]] for i in range(n)]]
    return result
