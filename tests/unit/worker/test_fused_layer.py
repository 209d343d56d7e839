"""Decoder layers run as one C++ call (layers/fused_layer.py, kernels/cpu/decoder_layer.cpp) against the
Python layer they replace, on tiny GGUF models the test writes: the fused op calls the same kernels in the
same order, so tokens and logprobs must be equal exactly, not just close. Each case also says how many
layers the fused op took, so a fusion that silently stopped applying fails here too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness.gguf_models import quantize_checkpoint
from harness.greedy_reference import random_prompts
from harness.lora_adapters import make_peft_adapter

from pagedserve import LLM, SamplingParams
from pagedserve.services.worker.layers.fused_layer import FusedLayer
from pagedserve.services.worker.layers.lora import CPP_MAX_ROWS

WIDE = {"hidden_size": 256, "intermediate_size": 512}  # the K-quants' super-blocks are 256 weights
MOE_WIDE = {
    "hidden_size": 256,
    "num_attention_heads": 2,
    "head_dim": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 256,
}
# (arch, type, config overrides, layers fused of the tiny model's)
CASES = [
    ("llama", "Q4_1", {}, "all"),
    ("llama", "Q4_K_M", WIDE, "all"),  # a fused q/k/v of Q4_K q, k and Q6_K v: two kernel runs joined
    ("qwen3", "Q4_1", {}, "all"),  # per-head q/k norms
    ("mistral", "every-type", WIDE, "all"),  # every GGUF type the kernels read, a sliding window
    ("qwen3_moe", "Q4_K", MOE_WIDE, "all"),  # sparse layers and a dense one between them
    ("mixtral", "Q4_0", {}, "all"),
    ("qwen2", "Q4_0", {}, "all"),  # its q/k/v bias keeps that projection dense: a float32 one in the op
    ("llama", "float32", {}, "all"),  # a dense checkpoint: oneDNN's packed GEMM
    ("llama", "float32-unpacked", {}, "all"),  # F.linear (prepack_weights off)
    ("qwen2", "float32", {}, "all"),
    ("phi3", "float32", {}, "all"),  # a partial rotary (half of each head) and a window on every layer
    ("phi3-longrope", "float32", {}, "all"),  # LongRoPE: the step's cos/sin come long or short
    (
        "gemma2",
        "float32",
        {},
        "all",
    ),  # four norms a layer, GELU-tanh, logit softcaps, a window every other layer
    ("gemma3", "float32", {}, "all"),  # per-head q/k norms and a local rotary base for the sliding layers
    ("olmoe", "Q8_0", {}, "none"),  # q/k norms over the whole projection, clip_qkv
]


def _run(folder: Path, fused: bool, prompts: list[list[int]], **options) -> tuple[list, int, int]:
    llm = LLM(str(folder), num_blocks=256, **({"quantization": "gguf"} | options))
    model = llm.runner.model
    if not fused:
        model.use_fused_layers(False)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=3)
    outputs = [(o.token_ids, o.outputs[0].logprobs) for o in llm.generate(prompts, params)]
    return outputs, model.fused_layers, len(model.layers)


@pytest.mark.parametrize(
    ("arch", "type_name", "overrides", "fused"), CASES, ids=[f"{a}-{t}" for a, t, _, _ in CASES]
)
def test_fused_layers_give_the_python_layers_tokens_and_logprobs_exactly(
    tiny_model, tmp_path: Path, arch: str, type_name: str, overrides: dict, fused: str
) -> None:
    folder = tmp_path / arch
    shutil.copytree(tiny_model(arch, **overrides), folder)
    options = {}
    if type_name.startswith("float32"):  # the checkpoint as saved, its linears dense
        options = {"quantization": "none", "prepack_weights": type_name == "float32"}
    else:
        quantize_checkpoint(folder, type_name)
    prompts = random_prompts(8, seed=5, max_len=40)  # prefills of 1-40 tokens, then decodes
    with_op, count, layers = _run(folder, True, prompts, **options)
    without, off, _ = _run(folder, False, prompts, **options)
    assert count == (layers if fused == "all" else 0)
    assert off == 0
    assert with_op == without


def test_int8_activations_fuse_too(tiny_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_QUANT_ACTIVATIONS", "int8")
    folder = tmp_path / "llama"
    shutil.copytree(tiny_model("llama", **WIDE), folder)
    quantize_checkpoint(folder, "Q4_K_M")
    prompts = random_prompts(6, seed=7, max_len=30)
    with_op, count, layers = _run(folder, True, prompts)
    without, _, _ = _run(folder, False, prompts)
    assert count == layers
    assert with_op == without


def test_layers_over_an_int8_cache_run_in_python(tiny_model, tmp_path: Path) -> None:
    folder = tmp_path / "llama"
    shutil.copytree(tiny_model("llama"), folder)
    quantize_checkpoint(folder, "Q4_1")
    prompt = random_prompts(1, seed=1, max_len=12)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    llm = LLM(str(folder), num_blocks=64, quantization="gguf", kv_cache_dtype="int8")
    llm.generate(prompt, params)
    assert llm.runner.model.fused_layers == 0


def _run_adapters(
    folder: Path, adapters: dict[str, Path], fused: bool, quantization: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list, int, list[bool]]:
    """Mixed batches of two adapters and the base, the second adapter's bigger rank arriving later (its
    load grows the stacks the fused op holds), then a prefill too long for the LoRA kernel; -> the
    outputs, the layers fused at the end and, per call of the fused op, whether it took adapter rows."""
    llm = LLM(
        str(folder), num_blocks=256, quantization=quantization, max_loras=2, lora_modules={"a": adapters["a"]}
    )
    model = llm.runner.model
    if not fused:
        model.use_fused_layers(False)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=3)
    prompts = random_prompts(6, seed=11, max_len=30)
    outputs = []
    calls: list[bool] = []
    original = FusedLayer.__call__

    def counted(layer: FusedLayer, *args):
        lora = layer.lora
        calls.append(lora is not None and bool(lora.groups) and lora.row_slots is not None)
        return original(layer, *args)

    with monkeypatch.context() as patch:
        patch.setattr(FusedLayer, "__call__", counted)  # the real op still runs: a count
        run = llm.generate(prompts, params, lora=["a", None, "a", None, "a", "a"])
        outputs.append([(o.token_ids, o.outputs[0].logprobs) for o in run])
        llm.load_lora("b", str(adapters["b"]))
        run = llm.generate(prompts, params, lora=["b", "a", None, "b", "a", "b"])
        outputs.append([(o.token_ids, o.outputs[0].logprobs) for o in run])
        long_prompt = [token for prompt in random_prompts(40, seed=12, max_len=30) for token in prompt]
        assert len(long_prompt) > CPP_MAX_ROWS + 64  # its prefill's adapter rows take the torch paths
        run = llm.generate([long_prompt[:300], prompts[0]], params, lora=["b", "a"])
        outputs.append([(o.token_ids, o.outputs[0].logprobs) for o in run])
    return outputs, model.fused_layers, calls


@pytest.mark.parametrize("quantization", ["gguf", "none"])  # adapters over Q4_K_M, and over packed float32
def test_adapted_layers_fuse_and_give_the_python_layers_tokens_and_logprobs_exactly(
    tiny_model, tmp_path: Path, quantization: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "llama"
    shutil.copytree(tiny_model("llama", **WIDE), folder)
    adapters = {
        "a": make_peft_adapter(folder, tmp_path / "a", seed=1, rank=8),
        "b": make_peft_adapter(
            folder, tmp_path / "b", seed=2, rank=16, targets=("q_proj", "v_proj", "down_proj")
        ),
    }
    if quantization == "gguf":
        quantize_checkpoint(folder, "Q4_K_M")  # a two-run q/k/v, adapted in parts of ranks 8 and 16
    with_op, count, calls = _run_adapters(folder, adapters, True, quantization, monkeypatch)
    without, off, no_calls = _run_adapters(folder, adapters, False, quantization, monkeypatch)
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    assert (count, off, no_calls) == (layers, 0, [])
    assert any(calls), "no fused call took a step with adapter rows"
    assert with_op == without
    first = with_op[0]
    assert first[0][0] != first[1][0] or first[0][1] != first[1][1]  # the adapter changes the output


# The fused op has no code of its own per ISA path, but every kernel it calls does: run it where every
# kernel is the portable build (a fresh process, as PAGEDSERVE_CPU_ISA takes effect at the first load),
# so a machine with AVX2 or AVX-512 still proves the path an ARM or older x86 CPU takes.
PORTABLE_CHECK = """
import sys
from pagedserve import LLM, SamplingParams

def run(fused):
    llm = LLM(sys.argv[1], num_blocks=128, quantization="gguf")
    if not fused:
        llm.runner.model.use_fused_layers(False)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)
    outs = [(o.token_ids, o.outputs[0].logprobs) for o in llm.generate([[5, 9, 2, 7], [3] * 19], params)]
    model = llm.runner.model
    return outs, model.fused_layers, str(model.layers[0].fused.op) if fused else None

(with_op, count, op), (without, _, _) = run(True), run(False)
print(op, count, with_op == without)
"""


def test_the_portable_path_fuses_and_agrees(tiny_model, tmp_path: Path) -> None:
    folder = tmp_path / "llama"
    shutil.copytree(tiny_model("llama", **WIDE), folder)
    quantize_checkpoint(folder, "Q4_K_M")
    env = {**os.environ, "PAGEDSERVE_CPU_ISA": "portable"}
    done = subprocess.run(
        [sys.executable, "-c", PORTABLE_CHECK, str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    op, count, equal = done.stdout.split()[-3:]
    assert op.startswith("pagedserve_decoder_layer_portable."), done.stdout
    assert (count, equal) == (str(layers), "True"), done.stdout
