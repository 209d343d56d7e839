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


def test_a_hot_loaded_adapter_is_read_off_the_step_path_while_others_run(served, tmp_path):
    """A request naming an adapter its worker has never read, arriving while others decode, waits (a
    few steps) while the worker reads the adapter between steps; no step carries the read, and the
    request's tokens are what it gets alone."""
    from pagedserve.engine.engine import RequestDone

    llm, base, _folders = served
    fresh = make_peft_adapter(base, tmp_path / "fresh", seed=30, rank=6)
    loras = llm.runner.loras
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    now = 0.0
    for i in range(3):
        llm.scheduler.add_request(f"hot-base-{i}", PROMPTS[i], params, now)
    for _ in range(3):
        llm.engine.step()
    module = llm.scheduler.loras.add("fresh", str(fresh))
    direct, loads = loras.direct_reads, loras.num_loads
    llm.scheduler.add_request("hot-fresh", PROMPTS[5], GREEDY, now, lora=module)
    tokens: dict[str, list[int]] = {}
    for _ in range(500):
        for event in llm.engine.step():
            if isinstance(event, RequestDone):
                tokens[event.request_id] = list(event.completions[0].output_token_ids)
        if len(tokens) == 4:
            break
    llm.engine.flush()
    try:
        assert len(tokens) == 4
        assert loras.direct_reads == direct and loras.num_loads == loads + 1  # read once, on the side
        assert tokens["hot-fresh"] == llm.generate([PROMPTS[5]], GREEDY, lora="fresh")[0].token_ids
    finally:
        llm.unload_lora("fresh")


def _registered_then_broken(llm, base, folder, name):
    """An adapter registered (its header checked), then its weights file cut in half.
    -> (its module, the weights file, the file's good bytes)."""
    made = make_peft_adapter(base, folder, seed=32, rank=4)
    weights = made / "adapter_model.safetensors"
    good = weights.read_bytes()
    module = llm.scheduler.loras.add(name, str(made))
    weights.write_bytes(good[: len(good) // 2])
    return module, weights, good


def _step_until_done(llm, count, limit):
    """Engine steps until `count` requests are done (at most `limit`) -> request id -> RequestDone."""
    from pagedserve.engine.engine import RequestDone

    done = {}
    for _ in range(limit):
        done.update((e.request_id, e) for e in llm.engine.step() if isinstance(e, RequestDone))
        if len(done) == count:
            break
    llm.engine.flush()
    return done


def _ended_unreadable(llm, done, request_id, weights):
    """The request ended with `lora_unreadable` naming the broken file, and no block is held."""
    from pagedserve.engine.engine import WORKER_ID

    failed = done[request_id]
    assert failed.error_code == "lora_unreadable"
    assert failed.error_message is not None and str(weights) in failed.error_message
    blocks = llm.engine.block_manager
    assert blocks.num_requests() == 0 and blocks.num_free_blocks(WORKER_ID) == 256


def test_an_adapter_whose_files_broke_after_the_load_ends_its_requests_with_an_error_and_nothing_else(
    served, tmp_path
):
    """The adapter is registered (its header checked), then its weights file is truncated. The worker's
    read between steps fails; the request waiting on it ends with `lora_unreadable` naming the file, the
    requests running beside it finish with their tokens, no step fails and no block is held. Mended, the
    same adapter is read afresh for the next request."""
    llm, base, _folders = served
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    alone = [llm.generate([PROMPTS[i]], params)[0].token_ids for i in range(2)]
    for i in range(2):
        llm.scheduler.add_request(f"beside-{i}", PROMPTS[i], params, 0.0)
    llm.engine.step()
    module, weights, good = _registered_then_broken(llm, base, tmp_path / "broken", "broken")
    llm.scheduler.add_request("on-broken", PROMPTS[5], GREEDY, 0.0, lora=module)
    done = _step_until_done(llm, 3, 500)
    try:
        _ended_unreadable(llm, done, "on-broken", weights)
        assert [list(done[f"beside-{i}"].completions[0].output_token_ids) for i in range(2)] == alone
        assert done["beside-0"].error_code is None and "broken" not in llm.runner.loras.cached
        weights.write_bytes(good)  # mended: the next request's read finds it whole
        assert llm.generate([PROMPTS[5]], GREEDY, lora="broken")[0].token_ids
    finally:
        llm.unload_lora("broken")


def test_a_worker_that_never_reads_the_adapter_on_the_side_reads_it_in_a_step_after_the_patience(
    served, tmp_path, monkeypatch
):
    from itertools import count

    from pagedserve.engine.engine import RequestDone
    from pagedserve.services.scheduler.planning import LORA_READ_PATIENCE_S

    llm, base, _folders = served
    fresh = make_peft_adapter(base, tmp_path / "late", seed=31, rank=4)
    loras = llm.runner.loras
    monkeypatch.setattr(loras, "prefetch", lambda name, path: None)  # the ask is never answered
    ticks = count()
    monkeypatch.setattr(llm.engine, "clock", lambda: next(ticks) * 0.05)  # 20 calls a second
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    llm.scheduler.add_request("late-base", PROMPTS[0], params, 0.0)
    llm.engine.step()
    module = llm.scheduler.loras.add("late", str(fresh))
    direct = loras.direct_reads
    llm.scheduler.add_request("late-fresh", PROMPTS[5], GREEDY, llm.engine.clock(), lora=module)
    asked_at = llm.engine.clock()
    started_at = None
    for _ in range(2000):
        for event in llm.engine.step():
            if isinstance(event, RequestDone) and event.request_id == "late-fresh":
                started_at = llm.engine.clock()
        if started_at is not None:
            break
    llm.scheduler.abort("late-base")
    llm.engine.flush()
    try:
        assert started_at is not None and started_at - asked_at > LORA_READ_PATIENCE_S
        assert loras.direct_reads == direct + 1
    finally:
        llm.unload_lora("late")


def test_an_adapter_whose_files_broke_ends_its_request_on_a_worker_with_nothing_else_running(
    served, tmp_path
):
    """With nobody else running the worker reads the adapter inside the step that first names it (there
    is no step to read beside). A read that fails there ends that request with `lora_unreadable` naming
    the file, not the step: the worker lives on, writes no K/V for it, caches none of its blocks, and the
    same prompt under the mended adapter gets what it gets on a fresh adapter of the same files."""
    llm, base, _folders = served
    module, weights, good = _registered_then_broken(llm, base, tmp_path / "broken-idle", "broken-idle")
    llm.scheduler.add_request("on-broken-idle", PROMPTS[6], GREEDY, 0.0, lora=module)
    done = _step_until_done(llm, 1, 50)
    try:
        _ended_unreadable(llm, done, "on-broken-idle", weights)
        assert "broken-idle" not in llm.runner.loras.cached
        weights.write_bytes(good)  # mended: read afresh, and no block of the failed step is reused
        mended = llm.generate([PROMPTS[6]], GREEDY, lora="broken-idle")[0]
        assert mended.num_cached_tokens == 0
        llm.scheduler.loras.add("fresh-copy", str(weights.parent))
        assert mended.token_ids == llm.generate([PROMPTS[6]], GREEDY, lora="fresh-copy")[0].token_ids
    finally:
        llm.unload_lora("broken-idle")
        llm.unload_lora("fresh-copy")
