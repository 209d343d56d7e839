"""LoRA adapters as `.gguf` files (llama.cpp's convert_lora_to_gguf.py format) give what the same adapter
gives as a PEFT folder: the same logits in float32 (F32 file), within the file type's rounding otherwise,
for a Llama base (whose q/k rows the converter reorders) and a Qwen2 one; files that are not such an
adapter are refused naming the file and why, and change nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness.lora_adapters import make_peft_adapter, merged_model, peft_to_gguf
from test_lora import PROMPTS, _in_step_order, _step

from pagedserve.services.worker.runner import ModelRunner
from pagedserve.services.worker.weights.lora_adapter import AdapterError, finish_read, read_lora_adapter


def _logits(runner: ModelRunner, adapter: Path) -> torch.Tensor:
    result, logits = runner.execute_with_logits(_step(PROMPTS, [("a", adapter)] * len(PROMPTS)))
    assert logits is not None
    runner.loras.unload("a")  # type: ignore[union-attr]
    return _in_step_order(result, logits, len(PROMPTS))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_gguf_adapter_gives_the_peft_folders_logits(tiny_model, tmp_path, arch):
    base = tiny_model(arch)
    folder = make_peft_adapter(base, tmp_path / "peft", seed=4, rank=8, alpha=12)
    runner = ModelRunner(base, block_size=16, num_blocks=64, max_loras=1)
    from_folder = _logits(runner, folder)
    result, base_logits = runner.execute_with_logits(_step(PROMPTS, [None] * len(PROMPTS)))
    assert base_logits is not None
    moved = (from_folder - _in_step_order(result, base_logits, len(PROMPTS))).abs().max().item()
    # F32 holds the folder's values; F16 rounds A and B to 2^-11 of themselves; Q8_0 each of A's
    # 32-blocks to 1/254 of its largest value (0.4% of every layer's delta, compounding through the
    # layers: 3.4% of the adapter's move seen here): bounds on that move of the logits.
    for outtype, share in (("F32", 0.0), ("F16", 0.002), ("Q8_0", 0.05)):
        file = peft_to_gguf(folder, base, tmp_path / f"adapter-{outtype}.gguf", outtype)
        torch.testing.assert_close(_logits(runner, file), from_folder, atol=1e-5 + share * moved, rtol=0)
    # ...which is the merged model's (so the comparison could fail: the adapter moves the logits).
    reference = merged_model(base, folder)
    with torch.inference_mode():
        expected = torch.stack([reference(torch.tensor([p])).logits[0, -1] for p in PROMPTS])
    torch.testing.assert_close(from_folder, expected, atol=1e-4, rtol=0)
    assert (expected - merged_model(base, None)(torch.tensor([PROMPTS[0]])).logits[0, -1]).abs().max() > 1e-2


def test_a_gguf_adapter_is_read_a_pair_a_slice_into_what_its_folder_gives(tiny_model, tmp_path):
    base = tiny_model("llama")
    folder = make_peft_adapter(base, tmp_path / "peft", seed=5, rank=4)
    file = peft_to_gguf(folder, base, tmp_path / "adapter.gguf", "F32")
    loras = ModelRunner(base, block_size=16, num_blocks=64, max_loras=1).loras
    assert loras is not None

    def read(path: Path):
        return read_lora_adapter("a", path, loras.model, loras.linears, max_rank=16, dtype=torch.float32)

    want = finish_read(read(folder))
    slices, reading = 0, read(file)
    while True:
        slices += 1
        try:
            next(reading)
        except StopIteration as done:
            got = done.value
            break
    assert slices == sum(len(p.parts) for p in want.modules.values()) + 2  # opened, a pair each, made
    assert got.modules.keys() == want.modules.keys()
    for module, packed in want.modules.items():
        for (part, a, bt), (got_part, got_a, got_bt) in zip(
            packed.parts, got.modules[module].parts, strict=True
        ):
            assert part == got_part
            torch.testing.assert_close(got_a, a, atol=0, rtol=0)
            torch.testing.assert_close(got_bt, bt, atol=0, rtol=0)


def test_files_that_are_not_such_an_adapter_are_refused(tiny_model, tmp_path):
    import gguf

    base = tiny_model("qwen2")
    runner = ModelRunner(base, block_size=16, num_blocks=16, max_loras=1)
    loras = runner.loras
    assert loras is not None
    folder = make_peft_adapter(base, tmp_path / "peft", rank=4)
    good = peft_to_gguf(folder, base, tmp_path / "good.gguf")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(AdapterError, match=r"truncated.gguf"):
        loras.load("t", str(truncated))
    model_file = tmp_path / "model.gguf"  # a file of weights, not an adapter
    writer = gguf.GGUFWriter(model_file, "qwen2")
    writer.add_tensor("blk.0.attn_q.weight", torch.zeros(8, 32).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(AdapterError, match=r"model.gguf is not a LoRA adapter: general.type None"):
        loras.load("m", str(model_file))
    llama_base = tiny_model("llama")
    for_llama = peft_to_gguf(
        make_peft_adapter(llama_base, tmp_path / "l", rank=4), llama_base, tmp_path / "l.gguf"
    )
    with pytest.raises(AdapterError, match=r"made for a 'llama' model .* this one is Qwen2ForCausalLM"):
        loras.load("l", str(for_llama))
    assert not loras.cached and loras.num_loads == 0
    assert loras.load("g", str(good)).rank == 4  # ...and a good one still loads


def _llama_cpp_converter() -> Path | None:
    """convert_lora_to_gguf.py of the llama.cpp peer's source tree (ops/peers/setup_llamacpp.sh), or
    of a llama.cpp checkout named by PAGEDSERVE_LLAMACPP_SOURCE."""
    from harness.llamacpp_convert import find_converter

    from pagedserve.ops.bench.llamacpp_server import llamacpp_venv

    named = os.environ.get("PAGEDSERVE_LLAMACPP_SOURCE")
    folder = Path(named) if named else find_converter(llamacpp_venv())
    return folder if folder is not None and (folder / "convert_lora_to_gguf.py").is_file() else None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_llama_cpps_own_converter_output_gives_the_peft_folders_logits(tiny_model, tmp_path, arch):
    converter = _llama_cpp_converter()
    if converter is None:  # an optional peer: CI and fresh clones have no llama.cpp source
        pytest.skip("no llama.cpp source: run ops/peers/setup_llamacpp.sh or set PAGEDSERVE_LLAMACPP_SOURCE")
    base = tiny_model(arch)
    folder = make_peft_adapter(base, tmp_path / "peft", seed=6, rank=8, alpha=16)
    out = tmp_path / "converted.gguf"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(converter / "gguf-py"), str(converter)])}
    done = subprocess.run(
        [sys.executable, str(converter / "convert_lora_to_gguf.py"), "--base", str(base), "--outtype", "f32",
         "--outfile", str(out), str(folder)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runner = ModelRunner(base, block_size=16, num_blocks=64, max_loras=1)
    torch.testing.assert_close(_logits(runner, out), _logits(runner, folder), atol=1e-5, rtol=0)
