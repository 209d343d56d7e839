"""The C++ sampling op at its edges, on every ISA path this CPU runs (avx512, avx2, portable): the
ends of the uniform, masked tokens, ties and NaN, any row length and stride, nuclei that need every
token of a 49k vocabulary, and the same tokens as the torch path for the same seeds."""

from __future__ import annotations

import math
import stat
from pathlib import Path
from typing import Any

import pytest
import torch

from pagedserve.kernels.cpu.build import SAMPLING, KernelBuildError, load_extension
from pagedserve.kernels.cpu.isa import ISA_ENV
from pagedserve.services.worker import sampler
from pagedserve.services.worker.sampler import Sampler
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import WorkerSampling

LAST_UNIFORM = 1.0 - 2.0**-24  # the largest float32 torch.rand returns


@pytest.fixture(scope="module")
def ops(isa: str) -> Any:
    return load_extension(SAMPLING, isa)


def sample_rows(
    ops: Any,
    logits: torch.Tensor,
    uniforms: list[float],
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> list[int]:
    rows = logits.shape[0]
    inv_t = 0.0 if temperature == 0.0 else 1.0 / temperature
    return ops.sample_rows(
        logits,
        torch.full((rows,), inv_t),
        torch.tensor(uniforms, dtype=torch.float32),
        torch.full((rows,), top_k, dtype=torch.long),
        torch.full((rows,), top_p),
        torch.full((rows,), min_p),
    ).tolist()


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 255, 256, 257, 1000, 4099])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_ends_of_the_uniform_draw_the_first_and_last_kept_token(
    ops: Any, vocab: int, dtype: torch.dtype
) -> None:
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(vocab)).to(dtype)
    logits[:, 0] = -math.inf  # masked (min_tokens): weighs nothing, even where the walk starts
    if vocab > 2:
        logits[:, -1] = -math.inf
    kept = (logits[0] > -math.inf).nonzero().squeeze(1)
    if kept.numel() == 0:
        return
    for rule in [{}, {"top_p": 0.999999}, {"min_p": 1e-30}, {"top_k": vocab - 1}]:
        assert sample_rows(ops, logits, [0.0, LAST_UNIFORM], **rule) == [int(kept[0]), int(kept[-1])], rule


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_greedy_takes_the_first_of_tied_maxima_and_the_first_nan(ops: Any, dtype: torch.dtype) -> None:
    logits = torch.zeros(3, 100, dtype=dtype)
    logits[:, [17, 40, 99]] = 5.0
    logits[1, [60, 80]] = math.nan
    logits[2, 55] = math.inf
    assert sample_rows(ops, logits, [0.5] * 3, temperature=0.0) == [17, 60, 55]
    assert sample_rows(ops, logits, [0.5] * 3, temperature=0.0) == logits.argmax(dim=1).tolist()


def test_a_row_that_is_all_masked_takes_the_argmax_instead_of_failing(ops: Any) -> None:
    logits = torch.full((1, 50), -math.inf)
    assert sample_rows(ops, logits, [0.3]) == [0]


def test_strided_rows_read_only_their_own_columns(ops: Any) -> None:
    wide = torch.randn(4, 1024, generator=torch.Generator().manual_seed(1))
    wide[:, 1000:] = 100.0  # padding columns that would win every draw if read
    tokens = sample_rows(ops, wide[:, :1000], [0.1, 0.5, 0.9, LAST_UNIFORM], temperature=0.7)
    assert all(0 <= t < 1000 for t in tokens)
    assert (
        sample_rows(ops, wide[:, :1000], [0.0] * 4, temperature=0.0) == wide[:, :1000].argmax(dim=1).tolist()
    )


def test_top_p_over_a_flat_vocabulary_keeps_the_exact_nucleus(ops: Any) -> None:
    vocab, top_p = 49152, 0.5
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(2)) * 0.01
    probs, order = logits[0].double().softmax(0).sort(descending=True)
    mass_before = probs.cumsum(0) - probs
    # Float rounding may move the cut by a token or two; nothing farther than that.
    allowed = set(order[mass_before < top_p + 1e-6].tolist())
    uniforms = torch.rand(400, generator=torch.Generator().manual_seed(3)).tolist()
    tokens = sample_rows(ops, logits.expand(400, -1).contiguous(), uniforms, top_p=top_p)
    assert set(tokens) <= allowed
    assert len(set(tokens)) > 300  # it draws across the ~25k-token nucleus


def test_top_k_deeper_than_every_first_candidate_looks_at_the_whole_row(ops: Any) -> None:
    # 10 tokens near the top, the rest 100 nats below: the 1000 best are only found by looking at all.
    logits = torch.full((1, 5000), -100.0)
    logits[0, 4990:] = torch.linspace(0.0, 1.0, 10)
    uniforms = torch.rand(200, generator=torch.Generator().manual_seed(4)).tolist()
    tokens = sample_rows(ops, logits.expand(200, -1).contiguous(), uniforms, top_k=1000, top_p=0.5)
    assert set(tokens) <= set(range(4990, 5000)) and len(set(tokens)) > 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_each_path_draws_the_torch_paths_token_for_the_same_seed(isa: str, dtype: torch.dtype) -> None:
    vocab, rows = 3000, 128
    logits = (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(11)) * 3).to(dtype)
    on_torch, on_path = Sampler(vocab, [], backend="torch"), Sampler(vocab, [], backend="cpp", isa=isa)
    assert on_path.isa == isa
    rules: list[dict[str, Any]] = [
        {"temperature": 0.0},
        {"temperature": 0.6},
        {"temperature": 0.8, "top_k": 50},
        {"temperature": 0.8, "top_p": 0.9},
        {"temperature": 1.0, "min_p": 0.05},
        {"temperature": 1.1, "top_k": 300, "top_p": 0.95, "min_p": 0.01},
    ]
    for params in rules:
        requests = [
            sampler.SamplingRequest(WorkerSampling.of(SamplingParams(**params), row), [0], [])
            for row in range(rows)
        ]
        assert on_path.sample(logits, requests)[0] == on_torch.sample(logits, requests)[0], params


def test_the_cpu_isa_setting_picks_the_samplers_path(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    forced = isa
    monkeypatch.setenv(ISA_ENV, forced)
    chosen = Sampler(10, eos_token_ids=[], backend="cpp")
    assert chosen.isa == forced
    # The op it calls is that path's build, not only its name.
    assert chosen._sample_rows.namespace == f"pagedserve_sampling_{forced}"


def test_auto_falls_back_to_torch_where_no_path_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real failed build: a fresh cache (nothing built yet) and a compiler that only fails. The fresh
    # cache and the compiler are both in the build folder's key, so no earlier build is reused.
    compiler = tmp_path / "failing-c++"
    compiler.write_text("#!/bin/sh\necho 'error: this compiler always fails' >&2\nexit 1\n")
    compiler.chmod(compiler.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv(ISA_ENV, "portable")  # one path to fail, not three
    monkeypatch.setattr("pagedserve.kernels.cpu.build._loaded", set())
    assert Sampler(10, eos_token_ids=[]).backend == "torch"
    with pytest.raises(KernelBuildError, match="sampling \\[portable\\] did not build"):
        Sampler(10, eos_token_ids=[], backend="cpp")
    assert list((tmp_path / "cache" / "kernels").glob("sampling_portable_*/failed"))  # it did try


def test_an_unknown_backend_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="sampler backend must be one of auto, cpp, torch"):
        Sampler(10, eos_token_ids=[], backend="cuda")
