"""LoRA through the whole in-process engine (LLM: scheduler, block manager, worker runner): a batch of 8
requests over 4 adapters and the base gives each the tokens it gets alone (and transformers' on the
merged model), with prefix caching on and equal prompts under different adapters; the load/unload
life cycle and its refusals."""

from __future__ import annotations

import pytest
import torch
from harness.lora_adapters import make_peft_adapter, merged_model

from pagedserve import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
SHARED = [11, 40, 73, 9, 120, 5, 66, 200, 31, 18, 7, 99]  # 12 tokens: a full block of 8 is cached
PROMPTS = [
    SHARED + [3],
    SHARED + [3],
    SHARED + [4, 5],
    SHARED + [3],
    SHARED + [3],
    [8, 9, 10],
    SHARED + [6],
    [50],
]
LORAS = ["a", "b", "c", "d", None, "a", "b", None]


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    base = tiny_model("llama")
    root = tmp_path_factory.mktemp("lora-engine")
    folders = {
        name: make_peft_adapter(base, root / name, seed=10 + i, rank=4 + 2 * i)
        for i, name in enumerate("abcd")
    }
    llm = LLM(
        str(base),
        block_size=8,
        num_blocks=256,
        max_loras=4,
        lora_modules={k: str(v) for k, v in folders.items()},
    )
    return llm, base, folders


def test_a_batch_over_four_adapters_and_the_base_matches_each_request_alone(served):
    llm, base, folders = served
    batch = [o.token_ids for o in llm.generate(PROMPTS, GREEDY, lora=LORAS)]
    alone = [
        llm.generate([p], GREEDY, lora=lora)[0].token_ids for p, lora in zip(PROMPTS, LORAS, strict=True)
    ]
    assert batch == alone
    # Equal prompts under different adapters got different tokens: the prefix cache kept them apart...
    assert len({tuple(batch[i]) for i in (0, 1, 3, 4)}) == 4
    # ...and each is what transformers gives on the merged model.
    for prompt, lora, got in zip(PROMPTS, LORAS, batch, strict=True):
        model = merged_model(base, None if lora is None else folders[lora])
        with torch.inference_mode():
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert got == ids[0, len(prompt) :].tolist(), lora
    assert llm.block_manager.num_cached_blocks() > 0


def test_adapters_over_the_step_cap_wait_their_turn(tiny_model, tmp_path):
    """max_loras=2 and three adapters in one call: the scheduler never puts a third in a step (the
    worker would refuse it), and every request still gets its own tokens."""
    base = tiny_model("llama")
    folders = {n: str(make_peft_adapter(base, tmp_path / n, seed=i, rank=2)) for i, n in enumerate("xyz")}
    llm = LLM(str(base), block_size=8, num_blocks=128, max_loras=2, lora_modules=folders)
    loras = ["x", "y", "z", "x", None, "z"]
    prompts = [[5 + i, 6, 7] for i in range(len(loras))]
    batch = [o.token_ids for o in llm.generate(prompts, GREEDY, lora=loras)]
    alone = [
        llm.generate([p], GREEDY, lora=lora)[0].token_ids for p, lora in zip(prompts, loras, strict=True)
    ]
    assert batch == alone


def test_load_and_unload_refusals_change_nothing(served, tmp_path):
    llm, _base, folders = served
    with pytest.raises(ValueError, match="'a' is already loaded"):
        llm.load_lora("a", str(folders["b"]))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        llm.load_lora("e", str(tmp_path))
    (tmp_path / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="adapter_config.json: unreadable"):
        llm.load_lora("e", str(tmp_path))
    with pytest.raises(ValueError, match="no LoRA adapter named 'e'"):
        llm.generate([[1, 2]], GREEDY, lora="e")
    assert llm.scheduler.loras.names() == ["a", "b", "c", "d"]
    before = llm.generate([[5, 6, 7]], GREEDY, lora="d")[0].token_ids
    llm.unload_lora("d")
    with pytest.raises(ValueError, match="no LoRA adapter named 'd'"):
        llm.generate([[5, 6, 7]], GREEDY, lora="d")
    llm.load_lora("d", str(folders["d"]))  # a new load: a new cache namespace, the same tokens
    assert llm.generate([[5, 6, 7]], GREEDY, lora="d")[0].token_ids == before


def test_a_gguf_adapter_file_serves_as_its_peft_folder_does(served, tmp_path):
    """llama.cpp users' form of the same adapter, loaded at run time beside the folders: the same
    greedy tokens, in a batch with the folders' adapters and the base."""
    from harness.lora_adapters import peft_to_gguf

    llm, base, folders = served
    llm.load_lora("a-gguf", str(peft_to_gguf(folders["a"], base, tmp_path / "a.gguf")))
    try:
        got = llm.generate(PROMPTS[:4], GREEDY, lora=["a-gguf", "a", "b", "a-gguf"])
        assert (
            got[0].token_ids == got[1].token_ids == llm.generate([PROMPTS[0]], GREEDY, lora="a")[0].token_ids
        )
        assert got[3].token_ids == llm.generate([PROMPTS[3]], GREEDY, lora="a")[0].token_ids
    finally:
        llm.unload_lora("a-gguf")
