"""The C++ sampling op at its edges: the ends of the uniform, masked tokens, ties and NaN, any row
length and stride, and nuclei that need every token of a 49k vocabulary."""

from __future__ import annotations

import math

import pytest
import torch
from pagedserve.kernels.cpu.build import load_sampling

LAST_UNIFORM = 1.0 - 2.0**-24  # the largest float32 torch.rand returns


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    load_sampling()


def sample_rows(
    logits: torch.Tensor,
    uniforms: list[float],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> list[int]:
    rows = logits.shape[0]
    inv_t = 0.0 if temperature == 0.0 else 1.0 / temperature
    return torch.ops.pagedserve_sampling.sample_rows(
        logits,
        torch.full((rows,), inv_t),
        torch.tensor(uniforms, dtype=torch.float32),
        torch.full((rows,), top_k, dtype=torch.long),
        torch.full((rows,), top_p),
        torch.full((rows,), min_p),
    ).tolist()


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 255, 256, 257, 1000, 4099])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_ends_of_the_uniform_draw_the_first_and_last_kept_token(vocab: int, dtype: torch.dtype) -> None:
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(vocab)).to(dtype)
    logits[:, 0] = -math.inf  # masked (min_tokens): weighs nothing, even where the walk starts
    if vocab > 2:
        logits[:, -1] = -math.inf
    kept = (logits[0] > -math.inf).nonzero().squeeze(1)
    if kept.numel() == 0:
        return
    for rule in [{}, {"top_p": 0.999999}, {"min_p": 1e-30}, {"top_k": vocab - 1}]:
        assert sample_rows(logits, [0.0, LAST_UNIFORM], **rule) == [int(kept[0]), int(kept[-1])], rule


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_greedy_takes_the_first_of_tied_maxima_and_the_first_nan(dtype: torch.dtype) -> None:
    logits = torch.zeros(3, 100, dtype=dtype)
    logits[:, [17, 40, 99]] = 5.0
    logits[1, [60, 80]] = math.nan
    logits[2, 55] = math.inf
    assert sample_rows(logits, [0.5] * 3, temperature=0.0) == [17, 60, 55]
    assert sample_rows(logits, [0.5] * 3, temperature=0.0) == logits.argmax(dim=1).tolist()


def test_a_row_that_is_all_masked_takes_the_argmax_instead_of_failing() -> None:
    logits = torch.full((1, 50), -math.inf)
    assert sample_rows(logits, [0.3]) == [0]


def test_strided_rows_read_only_their_own_columns() -> None:
    wide = torch.randn(4, 1024, generator=torch.Generator().manual_seed(1))
    wide[:, 1000:] = 100.0  # padding columns that would win every draw if read
    tokens = sample_rows(wide[:, :1000], [0.1, 0.5, 0.9, LAST_UNIFORM], temperature=0.7)
    assert all(0 <= t < 1000 for t in tokens)
    assert sample_rows(wide[:, :1000], [0.0] * 4, temperature=0.0) == wide[:, :1000].argmax(dim=1).tolist()


def test_top_p_over_a_flat_vocabulary_keeps_the_exact_nucleus() -> None:
    vocab, top_p = 49152, 0.5
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(2)) * 0.01
    probs, order = logits[0].double().softmax(0).sort(descending=True)
    mass_before = probs.cumsum(0) - probs
    # Float rounding may move the cut by a token or two; nothing farther than that.
    allowed = set(order[mass_before < top_p + 1e-6].tolist())
    uniforms = torch.rand(400, generator=torch.Generator().manual_seed(3)).tolist()
    tokens = sample_rows(logits.expand(400, -1).contiguous(), uniforms, top_p=top_p)
    assert set(tokens) <= allowed
    assert len(set(tokens)) > 300  # it draws across the ~25k-token nucleus


def test_top_k_deeper_than_every_first_candidate_looks_at_the_whole_row() -> None:
    # 10 tokens near the top, the rest 100 nats below: the 1000 best are only found by looking at all.
    logits = torch.full((1, 5000), -100.0)
    logits[0, 4990:] = torch.linspace(0.0, 1.0, 10)
    uniforms = torch.rand(200, generator=torch.Generator().manual_seed(4)).tolist()
    tokens = sample_rows(logits.expand(200, -1).contiguous(), uniforms, top_k=1000, top_p=0.5)
    assert set(tokens) <= set(range(4990, 5000)) and len(set(tokens)) > 1


def test_auto_falls_back_to_torch_where_the_op_cannot_be_built(monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedserve.kernels.cpu.build import KernelBuildError
    from pagedserve.services.worker import sampler

    def no_compiler() -> None:
        raise KernelBuildError("no g++ here")

    monkeypatch.setattr(sampler, "load_sampling", no_compiler)
    assert sampler.Sampler(10, eos_token_ids=[]).backend == "torch"
    with pytest.raises(KernelBuildError):
        sampler.Sampler(10, eos_token_ids=[], backend="cpp")


def test_an_unknown_backend_is_refused_by_name() -> None:
    from pagedserve.services.worker.sampler import Sampler

    with pytest.raises(ValueError, match="sampler backend must be one of auto, cpp, torch"):
        Sampler(10, eos_token_ids=[], backend="cuda")
