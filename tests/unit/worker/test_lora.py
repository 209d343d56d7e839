"""LoRA adapters on our model code against PEFT's merge_and_unload (float32, CPU): logits within 1e-4 and
greedy tokens identical, with rows of several adapters and of none in the same step, over dense
(oneDNN-packed and plain) and GGUF-quantized projections; and the refusals at load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from harness.gguf_models import quantize_checkpoint
from harness.lora_adapters import make_peft_adapter, merged_model
from harness.tiny_models import ARCHITECTURES, make_tiny_model
from worker_driver import GREEDY, StepDriver

from pagedserve.services.worker import lora_slots
from pagedserve.services.worker.layers.lora import LoRALinear
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.services.worker.weights.lora_adapter import (
    AdapterError,
    PackedLoRA,
    finish_read,
    read_lora_adapter,
)
from pagedserve.shared.protocol.step import Execute, NewRequest

PROMPTS = [[5, 9, 77, 31, 8], [100, 3, 45], [7, 7, 7, 200, 13, 250, 4], [60, 61], [33, 90, 12, 4, 150, 2]]


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory):
    """Per architecture: (checkpoint, {adapter name: folder}), built once for the module."""
    cache: dict[str, tuple[Path, dict[str, Path]]] = {}

    def get(arch: str) -> tuple[Path, dict[str, Path]]:
        if arch not in cache:
            base = tiny_model(arch)
            root = tmp_path_factory.mktemp(f"lora-{arch}")
            folders = {
                "all": make_peft_adapter(base, root / "all", seed=1, rank=8, alpha=16),
                # q and v only, rsLoRA, a per-module rank and alpha
                "qv": make_peft_adapter(
                    base,
                    root / "qv",
                    seed=2,
                    rank=4,
                    alpha=8,
                    targets=("q_proj", "v_proj", "down_proj"),
                    use_rslora=True,
                    rank_pattern={"down_proj": 16},
                    alpha_pattern={"v_proj": 3.0},
                ),
            }
            cache[arch] = (base, folders)
        return cache[arch]

    return get


def _step(prompts: list[list[int]], loras: list[tuple[str, Path] | None]) -> Execute:
    step = Execute(0)
    next_block = 0
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        blocks = list(range(next_block, next_block + -(-len(prompt) // 16)))
        next_block += len(blocks)
        name, path = (None, None) if lora is None else (lora[0], str(lora[1]))
        step.new_requests.append(
            NewRequest(f"r{i}", prompt, len(prompt), 0, len(prompt), blocks, GREEDY, name, path)
        )
    return step


def _in_step_order(result, logits: torch.Tensor, count: int) -> torch.Tensor:
    """The runner groups rows by adapter: logits rows follow result.request_ids; back to r0, r1, ..."""
    row = {rid: i for i, rid in enumerate(result.request_ids)}
    return logits[[row[f"r{i}"] for i in range(count)]]


def _reference_logits(base: Path, adapter: Path | None, prompts: list[list[int]]) -> torch.Tensor:
    model = merged_model(base, adapter)
    with torch.inference_mode():
        return torch.stack([model(torch.tensor([p])).logits[0, -1] for p in prompts])


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize(
    ("prepack", "kernel"),
    [(True, "cpp"), (True, "torch"), (False, "cpp")],
    ids=["packed", "packed-torch", "dense"],
)
def test_mixed_step_logits_match_merged_peft(adapters, arch, prepack, kernel):
    base, folders = adapters(arch)
    # Rows of "all" are not contiguous (an index gather), "qv" is one slice, two rows run the base.
    loras = [("all", folders["all"]), None, ("qv", folders["qv"]), ("all", folders["all"]), None]
    runner = ModelRunner(base, block_size=16, num_blocks=64, max_loras=2, prepack_weights=prepack)
    assert any(isinstance(m, LoRALinear) for m in runner.model.modules())
    assert runner.loras is not None
    runner.loras.batch.cpp = kernel == "cpp"  # "torch": the masked GEMMs (five rows)
    result, logits = runner.execute_with_logits(_step(PROMPTS, loras))
    assert logits is not None
    logits = _in_step_order(result, logits, len(PROMPTS))
    for name in (None, "all", "qv"):
        rows = [i for i, lora in enumerate(loras) if (lora and lora[0]) == name]
        expected = _reference_logits(
            base, None if name is None else folders[name], [PROMPTS[i] for i in rows]
        )
        torch.testing.assert_close(logits[rows], expected, atol=1e-4, rtol=0)
    # The adapters really move the logits (so the comparison above could fail).
    base_only = _reference_logits(base, None, [PROMPTS[0]])
    assert (logits[0] - base_only[0]).abs().max() > 1e-2


@pytest.mark.parametrize("lora_dtype", ["bfloat16", "float16"])
def test_half_slots_give_the_float32_logits_of_an_adapter_stored_in_that_dtype(
    tiny_model, tmp_path, lora_dtype
):
    """--lora-dtype: an adapter whose weights the half dtype holds exactly (as one saved in it is) gives
    the very logits of float32 slots on the kernel, and the same to rounding on the torch paths."""
    from safetensors.torch import load_file, save_file

    base = tiny_model("llama")
    folder = make_peft_adapter(base, tmp_path / "half", seed=3, rank=8, alpha=16)  # scale 2: exact
    weights = folder / "adapter_model.safetensors"
    half = getattr(torch, lora_dtype)
    save_file({k: v.to(half).float() for k, v in load_file(weights).items()}, weights)
    loras = [("half", folder), None, ("half", folder)]

    def logits(dtype: str, path: str) -> torch.Tensor:
        runner = ModelRunner(base, block_size=16, num_blocks=64, max_loras=1, lora_dtype=dtype)
        assert runner.loras is not None
        runner.loras.batch.cpp = path == "cpp"
        result, out = runner.execute_with_logits(_step(PROMPTS[:3], loras))
        assert out is not None
        return _in_step_order(result, out, 3)

    wide = logits("float32", "cpp")
    assert torch.equal(logits(lora_dtype, "cpp"), wide)
    torch.testing.assert_close(logits(lora_dtype, "torch"), wide, atol=1e-4, rtol=0)
    runner = ModelRunner(base, block_size=16, num_blocks=64, max_loras=1, lora_dtype=lora_dtype)
    runner.execute_with_logits(_step(PROMPTS[:1], loras[:1]))
    assert {m.a.dtype for m in runner.model.modules() if isinstance(m, LoRALinear) and m.rank} == {half}


def test_greedy_tokens_match_merged_peft_with_adapters_swapping_slots(adapters):
    """Three adapters (two copies of one under other names) over two slots, in one run: every
    request's greedy tokens equal transformers' on the merged model."""
    base, folders = adapters("llama")
    names = [("all", folders["all"]), ("qv", folders["qv"]), None]
    loras = [names[i % 3] for i in range(len(PROMPTS))]
    runner = ModelRunner(base, block_size=8, num_blocks=256, max_loras=2, max_cpu_loras=2)
    driver = StepDriver(runner, chunk_size=3, stop_token_ids=tuple(runner.eos_token_ids))
    outputs = driver.generate(PROMPTS, 12, loras=[None if x is None else (x[0], str(x[1])) for x in loras])
    for prompt, lora, got in zip(PROMPTS, loras, outputs, strict=True):
        model = merged_model(base, None if lora is None else lora[1])
        with torch.inference_mode():
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert got == ids[0, len(prompt) :].tolist(), lora
    # A later run with only "qv" and a third adapter: slots are reused, cached adapters stay LRU-capped.
    other = make_peft_adapter(base, folders["all"].parent / "third", seed=5, rank=2, alpha=2)
    driver.generate(PROMPTS[:2], 3, loras=[("third", str(other)), ("qv", str(folders["qv"]))])
    assert runner.loras is not None
    assert sorted(s for s in runner.loras.slots if s) == ["qv", "third"]
    assert len(runner.loras.cached) <= 2


def test_quantized_base_with_an_adapter_matches_the_merged_dequantized_model(tmp_path):
    base = make_tiny_model("llama", tmp_path / "q")
    quantize_checkpoint(base, "Q8_0")  # the folder's safetensors now hold the dequantized weights
    adapter = make_peft_adapter(base, tmp_path / "a", seed=3, rank=8)
    runner = ModelRunner(base, block_size=16, num_blocks=64, quantization="gguf", max_loras=1)
    assert runner.runtime["weights"].startswith("gguf Q8_0")
    result, logits = runner.execute_with_logits(_step(PROMPTS, [("a", adapter)] * len(PROMPTS)))
    logits = _in_step_order(result, logits, len(PROMPTS))
    torch.testing.assert_close(logits, _reference_logits(base, adapter, PROMPTS), atol=1e-4, rtol=0)


def _runner_with_nothing_loaded(adapters) -> tuple[ModelRunner, Path, dict[str, Path]]:
    base, folders = adapters("qwen2")
    return ModelRunner(base, block_size=16, num_blocks=16, max_loras=1, max_lora_rank=8), base, folders


def test_bad_adapters_are_refused_naming_the_file_or_module(adapters, tmp_path, tiny_model):
    runner, base, folders = _runner_with_nothing_loaded(adapters)
    loras = runner.loras
    assert loras is not None
    with pytest.raises(AdapterError, match="rank 16 > max_lora_rank 8"):
        loras.load("qv", str(folders["qv"]))  # its down_proj has rank 16
    corrupt = shutil.copytree(folders["all"], tmp_path / "corrupt")
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(AdapterError, match="adapter_model.safetensors: not a readable safetensors"):
        loras.load("c", str(corrupt))
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        loras.load("x", str(tmp_path))
    other_shape = make_peft_adapter(tiny_model("qwen2", hidden_size=32), tmp_path / "o", rank=4)
    with pytest.raises(AdapterError, match=r"module model.layers.0.mlp.down_proj has lora_A"):
        loras.load("o", str(other_shape))
    head = make_peft_adapter(base, tmp_path / "head", rank=4, targets=("lm_head",))
    with pytest.raises(
        AdapterError, match=r"full weights of a trained module is not supported \('base_model.model.lm_head"
    ):
        loras.load("h", str(head))
    dora = shutil.copytree(folders["all"], tmp_path / "dora")
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(AdapterError, match="DoRA is not supported"):
        loras.load("d", str(dora))
    assert not loras.cached and loras.slots == [None] and loras.num_loads == 0
    # ...and the runner still serves the base and a good adapter.
    good = make_peft_adapter(base, tmp_path / "good", rank=4)
    _result, logits = runner.execute_with_logits(_step(PROMPTS[:2], [("g", good), None]))
    assert logits is not None and torch.isfinite(logits).all()


def test_a_step_over_more_adapters_than_slots_is_refused(adapters):
    runner, _base, folders = _runner_with_nothing_loaded(adapters)
    step = _step(PROMPTS[:2], [("a", folders["all"]), ("b", folders["all"])])
    with pytest.raises(AdapterError, match="uses 2 LoRA adapters; this worker has 1 slots"):
        runner.execute(step)


def test_lora_linear_adds_each_rows_adapter_delta_by_slice_or_gather():
    """The layer alone: rows of slot 0 apart (a gather), slot 1 together (a slice), base rows unchanged."""
    from pagedserve.services.worker.layers.lora import LoRABatch

    torch.manual_seed(0)
    base = torch.nn.Linear(16, 12)
    batch = LoRABatch()
    layer = LoRALinear(base, batch, num_slots=2)
    weights = [(torch.randn(4, 16), torch.randn(12, 4)), (torch.randn(2, 16), torch.randn(12, 2))]
    for slot, (a, b) in enumerate(weights):
        layer.fill(slot, PackedLoRA(((0, a, b.t().contiguous()),)))  # B travels transposed
    x = torch.randn(6, 16)
    row_slots = [0, -1, 0, 1, 1, -1]
    batch.set_rows(row_slots)
    assert [type(rows) for _, rows in batch.groups] == [torch.Tensor, slice]
    want = base(x).detach()
    for row, slot in enumerate(row_slots):
        if slot >= 0:
            a, b = weights[slot]
            want[row] += (x[row] @ a.t()) @ b.t()
    for path in LORA_PATHS:
        _set_rows(batch, row_slots, path)
        with torch.inference_mode():
            got = layer(x)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# The C++ kernel; the masked GEMMs (six rows are few); the grouped GEMMs (the mask dropped).
LORA_PATHS = ("cpp", "masked", "grouped")


def _set_rows(batch, row_slots: list[int], path: str) -> None:
    batch.cpp = path == "cpp"
    batch.set_rows(row_slots)
    assert (batch.row_slots is not None) == (path == "cpp") and batch.mask is not None
    if path == "grouped":
        batch.mask = None


def test_the_kernel_takes_a_step_by_its_adapter_rows_not_its_base_rows():
    """A base prefill beside a few adapter decodes stays on the kernel (it skips base rows); many rows
    of one adapter go to the grouped GEMMs, where those are faster."""
    from pagedserve.services.worker.layers.lora import CPP_MAX_ROWS, LoRABatch

    batch = LoRABatch()
    batch.set_rows([-1] * 300 + [0] * 4 + [1] * 4)
    assert batch.row_slots is not None and batch.row_slots.tolist()[-8:] == [0] * 4 + [1] * 4
    batch.set_rows([0] * (CPP_MAX_ROWS + 1))
    assert batch.row_slots is None


def test_lora_linear_fused_parts_of_different_ranks_and_a_missing_part():
    """A fused linear (three parts): slot 0 adapts parts 0 and 2 at ranks 3 and 5, slot 1 part 1 at
    rank 2 (the stacks pad to 5 with zeros); slot 1 emptied again adds nothing; every path."""
    from pagedserve.services.worker.layers.lora import LoRABatch

    torch.manual_seed(1)
    base = torch.nn.Linear(8, 10)
    parts = [slice(0, 4), slice(4, 7), slice(7, 10)]
    batch = LoRABatch()
    layer = LoRALinear(base, batch, num_slots=3, parts=parts)
    slot0 = ((0, torch.randn(3, 8), torch.randn(4, 3)), (2, torch.randn(5, 8), torch.randn(3, 5)))
    slot1 = ((1, torch.randn(2, 8), torch.randn(3, 2)),)

    def packed(parts: tuple) -> PackedLoRA:  # B travels transposed
        return PackedLoRA(tuple((part, a, b.t().contiguous()) for part, a, b in parts))

    layer.fill(1, packed(slot1))  # rank 2 first: filling slot 0 grows the stacks and keeps it
    layer.fill(0, packed(slot0))
    x = torch.randn(5, 8)
    row_slots = [1, 0, -1, 0, 1]

    def expected(adapters: dict[int, tuple]) -> torch.Tensor:
        want = base(x).detach()
        for row, slot in enumerate(row_slots):
            for part, a, b in adapters.get(slot, ()):
                want[row, parts[part]] += (x[row] @ a.t()) @ b.t()
        return want

    for adapters in ({0: slot0, 1: slot1}, {0: slot0}):
        for path in LORA_PATHS:
            _set_rows(batch, row_slots, path)
            with torch.inference_mode():
                got = layer(x)
            torch.testing.assert_close(got, expected(adapters), atol=1e-5, rtol=1e-5)
        layer.fill(1, None)


def test_an_adapter_asked_for_is_read_between_steps_and_reported_ready_or_failed(adapters, tmp_path):
    runner, _base, folders = _runner_with_nothing_loaded(adapters)
    loras = runner.loras
    assert loras is not None
    path = str(folders["all"])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{}")  # no weights file: the read fails
    result = runner.execute(Execute(0, prefetch_loras=[("all", path), ("bad", str(bad))]))
    assert result.loras_ready == [] and result.loras_failed == []  # asked, not read yet
    failed = []
    for step in range(1, 200):  # the reads go on between steps, whatever the steps hold
        result = runner.execute(Execute(step))
        failed += result.loras_failed
        if result.loras_ready and failed:
            break
    assert result.loras_ready == [("all", path)] and "all" in loras.cached
    # The failure is reported once, with the error naming the file; the failed adapter is not ready.
    assert [(name, where) for name, where, _ in failed] == [("bad", str(bad))]
    assert "no adapter_model.safetensors" in failed[0][2]
    result = runner.execute(Execute(step + 1))
    assert result.loras_failed == [] and result.loras_ready == [("all", path)]
    # A step naming it finds it read; asked again, nothing is read twice.
    runner.execute(Execute(step + 2, prefetch_loras=[("all", path)]))
    _result, logits = runner.execute_with_logits(_step(PROMPTS[:1], [("all", folders["all"])]))
    assert logits is not None and loras.num_loads == 1 and loras.direct_reads == 0
    # The failed one, asked again, is read again (its files may have been mended) and fails the same way.
    runner.execute(Execute(step + 3, prefetch_loras=[("bad", str(bad))]))
    result = runner.execute(Execute(step + 4))
    assert [(name, where) for name, where, _ in result.loras_failed] == [("bad", str(bad))]
    with pytest.raises(AdapterError, match="no adapter_model.safetensors"):
        loras.load("bad", str(bad))
    assert list(loras.cached) == ["all"]


def test_a_read_takes_one_slice_between_steps_when_the_steps_leave_no_time_and_packs_the_same_adapter(
    adapters, monkeypatch
):
    runner, _base, folders = _runner_with_nothing_loaded(adapters)
    loras = runner.loras
    assert loras is not None
    monkeypatch.setattr(lora_slots, "READ_SHARE", 0.0)
    monkeypatch.setattr(lora_slots, "MIN_READ_SLICE_S", 0.0)
    whole = finish_read(
        read_lora_adapter(
            "whole",
            folders["all"],
            loras.model,
            loras.linears,
            max_rank=loras.max_lora_rank,
            dtype=loras.dtype,
        )
    )
    pairs = sum(len(packed.parts) for packed in whole.modules.values())
    path = str(folders["all"])
    runner.execute(Execute(0, prefetch_loras=[("all", path)]))
    steps = 0
    while "all" not in loras.cached and steps < 2 * pairs:
        steps += 1
        result = runner.execute(Execute(steps))
        assert (("all", path) in (result.loras_ready or [])) == ("all" in loras.cached)
    assert steps == pairs + 2  # the files opened, then a module's pair a slice, then the adapter made
    read = loras.cached["all"]
    assert read.modules.keys() == whole.modules.keys()
    for module, packed in whole.modules.items():
        for (part, a, bt), (got_part, got_a, got_bt) in zip(
            packed.parts, read.modules[module].parts, strict=True
        ):
            assert part == got_part and torch.equal(a, got_a) and torch.equal(bt, got_bt)


def test_a_step_naming_an_adapter_being_read_waits_for_that_read(adapters):
    runner, _base, folders = _runner_with_nothing_loaded(adapters)
    loras = runner.loras
    assert loras is not None
    loras.prefetch("all", str(folders["all"]))
    _result, logits = runner.execute_with_logits(_step(PROMPTS[:1], [("all", folders["all"])]))
    assert logits is not None and loras.num_loads == 1 and loras.direct_reads == 0
