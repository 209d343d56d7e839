"""The draft-model proposer through the in-process engine: a tiny target and a tiny draft with its
vocabulary; the tokens never change, the draft's own paged KV comes back whole.

Drafts: the target itself (its proposals are the target's own argmax, so nearly all are accepted: this
checks that the draft's K/V is kept right across steps, accepted proposals and catch-ups), and the
target with noise added to every weight (a weaker draft: accepted and rejected proposals).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file, save_file
from test_speculative_decoding import GREEDY, SAMPLED, assert_pool_whole, prompts, run

from pagedserve import LLM, SamplingParams
from pagedserve.services.worker.proposers.draft_model import DraftVocabularyMismatch
from pagedserve.shared.speculative_config import SpeculativeConfig


@pytest.fixture(scope="module")
def target(tiny_model):
    return str(tiny_model("llama"))


@pytest.fixture(scope="module")
def weak_draft(target, tmp_path_factory):
    """The target's checkpoint with Gaussian noise of 0.3x each weight's own spread added."""
    folder = tmp_path_factory.mktemp("weak-draft")
    shutil.copytree(target, folder, dirs_exist_ok=True)
    weights = load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(5)
    noisy = {
        name: w + 0.3 * w.float().std() * torch.randn(w.shape, generator=generator).to(w.dtype)
        for name, w in weights.items()
    }
    save_file(noisy, folder / "model.safetensors", metadata={"format": "pt"})
    return str(folder)


def spec(draft: str, k: int = 4) -> dict:
    return {"model": draft, "num_speculative_tokens": k, "max_step_rows": 64, "row_cost": 0.0}


def assert_draft_pool_whole(llm: LLM) -> None:
    """The worker forgets finished requests with its next step: run one (a request of one token never
    proposes), then every draft block is free."""
    proposer = llm.runner.proposer
    assert proposer.name == "draft_model"
    assert proposer.sequences, "the finished requests' draft sequences wait for the next step"
    llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=1))
    assert proposer.blocks_in_use == 0 and not proposer.sequences, (
        proposer.blocks_in_use,
        proposer.sequences,
    )


@pytest.fixture(scope="module")
def references(target):
    return {
        name: run(target, prompts(), params)[1] for name, params in (("greedy", GREEDY), ("sampled", SAMPLED))
    }


def test_the_target_as_its_own_draft_is_almost_always_right(target, references):
    llm, got = run(target, prompts(), GREEDY, spec(target))
    assert [o.token_ids for o in got] == [o.token_ids for o in references["greedy"]]
    stats = llm.scheduler.stats
    assert stats.spec_proposed > 50
    # Float rounding differs between a 1-row and a (1 + k)-row forward: a near-tie may flip, rarely.
    assert stats.spec_accepted >= 0.95 * stats.spec_proposed, (stats.spec_accepted, stats.spec_proposed)
    assert_pool_whole(llm)
    assert_draft_pool_whole(llm)


@pytest.mark.parametrize(
    ("kind", "engine"),
    [
        ("greedy", {"pipeline_depth": 1, "num_blocks": 24, "block_size": 8, "max_num_seqs": 8}),
        ("sampled", {"pipeline_depth": 2, "num_blocks": 24, "block_size": 8, "max_num_seqs": 8}),
        ("greedy", {"pipeline_depth": 2, "max_num_batched_tokens": 32}),
    ],
    ids=["greedy-depth1-preempting", "sampled-depth2-preempting", "greedy-depth2-chunked"],
)
def test_a_weak_draft_keeps_the_tokens_with_preemption_and_frees_its_blocks(
    target, weak_draft, references, kind, engine
):
    params = GREEDY if kind == "greedy" else SAMPLED
    llm, got = run(target, prompts(), params, spec(weak_draft), **engine)
    assert [o.token_ids for o in got] == [o.token_ids for o in references[kind]]
    stats = llm.scheduler.stats
    if kind == "greedy":
        assert 0 < stats.spec_accepted < stats.spec_proposed, "both accepted and rejected proposals"
    else:  # at temperature 1 a random model's distribution is flat: an argmax draft is rarely drawn
        assert stats.spec_proposed > 0
    if engine.get("num_blocks") == 24:
        assert stats.preemptions > 0, "the pool was meant to be too small for everyone at once"
    assert_pool_whole(llm)
    assert_draft_pool_whole(llm)


def test_a_draft_pool_without_room_proposes_nothing_and_changes_nothing(target, references):
    llm = LLM(target, num_blocks=256, block_size=16, speculative_config=spec(target))
    proposer = llm.runner.proposer
    proposer.free_blocks = proposer.free_blocks[-3:]  # room for one short request's draft at a time
    got = llm.generate(prompts(), GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in references["greedy"]]
    assert llm.scheduler.stats.spec_accepted > 0
    llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=1))
    assert len(proposer.free_blocks) == 3 and not proposer.sequences
    assert_pool_whole(llm)


def test_a_draft_with_another_vocabulary_is_refused_naming_it(target, tiny_model):
    other = str(tiny_model("llama", vocab_size=300))
    with pytest.raises(DraftVocabularyMismatch, match=r"speculative_config.model .*300 tokens.*320"):
        LLM(target, num_blocks=32, speculative_config=spec(other))


def test_the_config_names_what_a_draft_model_needs():
    assert SpeculativeConfig.model_validate({"model": "/m"}).method == "draft_model"  # vLLM's shorthand
    with pytest.raises(ValidationError, match="draft_model needs `model`"):
        SpeculativeConfig(method="draft_model")
    with pytest.raises(ValidationError, match="`model` is the draft checkpoint"):
        SpeculativeConfig(method="ngram", model="/m")


def test_a_gguf_cut_to_its_first_blocks_drafts_for_the_whole_gguf(target, tmp_path):
    """ops/bench/draft_gguf.py: the early-exit draft the bench uses for the bundled model, here cut from
    a tiny Q8_0 GGUF; a GGUF draft keeps its stored types and its tokenizer passes the vocabulary check."""
    from harness.gguf_models import write_gguf

    from pagedserve.ops.bench.draft_gguf import cut

    # write_gguf rewrites its folder's weights (dequantized): a copy, not the session's tiny model.
    folder = Path(shutil.copytree(target, tmp_path / "target"))
    whole = write_gguf(folder, tmp_path / "whole.gguf", "Q8_0")
    cut(whole, tmp_path / "first-2.gguf", layers=2)
    batch = prompts(4)
    _, reference = run(str(whole), batch, GREEDY)
    llm, got = run(str(whole), batch, GREEDY, spec(str(tmp_path / "first-2.gguf")))
    assert [o.token_ids for o in got] == [o.token_ids for o in reference]
    assert llm.runner.proposer.model.config.num_layers == 2
    assert llm.scheduler.stats.spec_proposed > 0
    with pytest.raises(ValueError, match=r"--layers must be in \[1, 3\]"):
        cut(whole, tmp_path / "none.gguf", layers=0)
