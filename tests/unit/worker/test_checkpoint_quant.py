"""GPTQ / AWQ / compressed-tensors checkpoints, written in the test in each format's layout
(tests/harness/quantized_checkpoints.py), repacked at load into the kernel's GGML blocks.

References are the formats' own dequantization, written in the harness from their specs
(weight = scale * (q - zero) over the test's own codes), never the code under test.

Tolerances:
- One linear through the kernel against x @ W_deq^T: the same 1e-5 of sum |x| |W| as
  tests/unit/kernels/test_quant_linear.py (float32 summation order), plus for Q4_1 the rounding of
  m = -scale * zero to fp16: at most half an fp16 ulp of |m| per weight, 2^-11 |m| (+ 2^-25 for
  fp16 subnormals), summed over |x|. Q4_0 and Q8_0 hold the checkpoint's weights exactly.
- A whole model, greedy, 12 prompts of 12 tokens: against the same folder loaded with
  --quantization none (the format's dequantization in float32). Q4_0 and Q8_0 differ from it only by
  summation order: the chosen tokens' logprobs moved by at most 1.3e-5 (measured on the four such
  models below). Q4_1 adds the m rounding, on these tiny random models' large weights (init range
  0.2): logprobs moved by up to 1.6e-2 (measured on the two). So while the tokens agree, the chosen
  token's logprob must agree within `drift` (1e-3 for the exact formats, ~75x the measured; 5e-2
  for Q4_1, ~3x), and a prompt may leave the reference only at a step where the reference's top two
  logprobs are within `drift` of each other (a near tie), never elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from harness.greedy_reference import random_prompts
from harness.quantized_checkpoints import (
    awq_tensors,
    ct_tensors,
    dequantize,
    gptq_tensors,
    quantize_checkpoint_as,
    rtn,
)
from harness.tiny_models import make_tiny_model

from pagedserve import LLM, SamplingParams
from pagedserve.kernels.torch_backend import TorchAttentionBackend
from pagedserve.services.worker.layers.quant_linear import QuantLinear, quant_ops
from pagedserve.services.worker.weights.checkpoint_quant import (
    Scheme,
    kernel_type,
    parse_scheme,
    read_linear,
    to_blocks,
)
from pagedserve.services.worker.weights.loader import load_model

# (id, scheme, quantizer args, writer, expected kernel type)
LINEAR_CASES = [
    ("gptq-4bit-asym-g128", Scheme("gptq", 4, 128, "gptq"), (4, 128, False), "gptq", "Q4_1"),
    ("gptq_v2-4bit-sym-g32", Scheme("gptq", 4, 32, "gptq_v2"), (4, 32, True), "gptq_v2", "Q4_0"),
    ("gptq-8bit-sym-channel", Scheme("gptq", 8, -1, "gptq"), (8, -1, True), "gptq", "Q8_0"),
    ("awq-4bit-g64", Scheme("awq", 4, 64, "gemm"), (4, 64, False), "awq", "Q4_1"),
    (
        "ct-pack-4bit-sym-g128",
        Scheme("compressed-tensors", 4, 128, "pack-quantized"),
        (4, 128, True),
        "ct-packed",
        "Q4_0",
    ),
    (
        "ct-pack-4bit-asym-g32",
        Scheme("compressed-tensors", 4, 32, "pack-quantized"),
        (4, 32, False),
        "ct-packed",
        "Q4_1",
    ),
    (
        "ct-int8-sym-channel",
        Scheme("compressed-tensors", 8, -1, "int-quantized"),
        (8, -1, True),
        "ct-int",
        "Q8_0",
    ),
    (
        "ct-int4-asym-g32",
        Scheme("compressed-tensors", 4, 32, "int-quantized"),
        (4, 32, False),
        "ct-int",
        "Q4_1",
    ),
    ("gptq-4bit-asym-g64-desc_act", Scheme("gptq", 4, 64, "gptq"), (4, 64, False, True), "gptq", "Q4_1"),
    ("gptq-8bit-sym-g32-desc_act", Scheme("gptq", 8, 32, "gptq_v2"), (8, 32, True, True), "gptq_v2", "Q8_0"),
]


def _write(qz, writer: str, sym: bool) -> dict[str, torch.Tensor]:
    if writer in ("gptq", "gptq_v2"):
        return gptq_tensors(qz, classic=writer == "gptq")
    if writer == "awq":
        return awq_tensors(qz)
    return ct_tensors(qz, packed=writer == "ct-packed", sym=sym)


@pytest.mark.parametrize(
    ("scheme", "args", "writer", "type_name"), [c[1:] for c in LINEAR_CASES], ids=[c[0] for c in LINEAR_CASES]
)
@pytest.mark.parametrize("rows", [1, 5])
def test_repacked_linear_matches_the_formats_dequantization(scheme, args, writer, type_name, rows) -> None:
    bits, group_size, sym, *act_order = args
    n, k = 40, 256
    rng = np.random.default_rng(7)
    dense = (rng.standard_normal((n, k)) * 0.1 + rng.standard_normal((n, 1)) * 0.05).astype(np.float32)
    scale_dtype = "bfloat16" if scheme.method == "compressed-tensors" else np.float16
    g_idx = None
    if act_order:  # GPTQ's desc_act: input perm[j] in group j // group_size
        perm = rng.permutation(k)
        g_idx = np.empty(k, np.int64)
        g_idx[perm] = np.arange(k) // group_size
    qz = rtn(dense, bits, group_size, sym, scale_dtype, g_idx)
    w_deq = torch.from_numpy(dequantize(qz))
    weight = read_linear(scheme, _write(qz, writer, sym), "layer")
    assert kernel_type(weight) == (type_name, "")
    blocks = to_blocks(weight, type_name, scheme.method)
    assert blocks.type_name == type_name and blocks.source == scheme.method
    assert (blocks.out_features, blocks.in_features) == (n, k)

    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    bias = torch.randn(n)
    assert (blocks.input_order is not None) == bool(act_order)
    with torch.inference_mode():
        out = QuantLinear(blocks, bias, quant_ops())(x)  # the layer: it gathers a desc_act weight's inputs
    expected = x @ w_deq.T + bias
    bound = 1e-5 * (x.abs() @ w_deq.abs().T + bias.abs())
    if type_name == "Q4_1":
        m = torch.from_numpy(np.abs(qz.scales * qz.zeros)[:, qz.g_idx]).float()
        bound += x.abs() @ (m * 2.0**-11 + 2.0**-25).T
    assert ((out - expected).abs() <= bound).all(), (out - expected).abs().max()


def test_dequantize_is_the_formats_definition() -> None:
    """IntWeight.dequantize (the --quantization none path) equals the spec's, for every layout."""
    rng = np.random.default_rng(1)
    dense = (rng.standard_normal((24, 128)) * 0.1).astype(np.float32)
    for _, scheme, (bits, group_size, sym, *_), writer, _ in LINEAR_CASES:
        if group_size > 128:
            continue
        scale_dtype = "bfloat16" if scheme.method == "compressed-tensors" else np.float16
        qz = rtn(dense, bits, group_size, sym, scale_dtype)
        got = read_linear(scheme, _write(qz, writer, sym), "layer").dequantize()
        assert torch.equal(got, torch.from_numpy(dequantize(qz))), writer


def _greedy(folder: Path, quantization: str, prompts: list[list[int]]) -> tuple[list, dict]:
    """-> (per prompt, per step: (token, its logprob, the runner-up's logprob)), the runtime."""
    llm = LLM(str(folder), num_blocks=256, quantization=quantization)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    steps = [
        [
            (token, top[0][1], top[1][1])
            for token, (_, top) in zip(o.token_ids, o.outputs[0].logprobs, strict=True)
        ]
        for o in llm.generate(prompts, params)
    ]
    return steps, llm.runner.runtime


MODEL_CASES = [
    (
        "llama-gptq-desc_act",
        "llama",
        {},
        "gptq",
        {"bits": 4, "group_size": 32, "sym": True, "desc_act_permuted": "shared"},
        "gptq Q4_0x",
    ),
    # (id, arch, config overrides, method, quantize_checkpoint_as kwargs, expected weights prefix)
    ("llama-gptq-4bit-asym", "llama", {}, "gptq", {"bits": 4, "group_size": 32}, "gptq Q4_1x"),
    ("qwen2-awq", "qwen2", {}, "awq", {"bits": 4, "group_size": 64}, "awq Q4_1x"),  # qkv bias kept
    (
        "qwen3-ct-pack-sym",
        "qwen3",
        {},
        "compressed-tensors",
        {"bits": 4, "group_size": 32, "sym": True, "fmt": "pack-quantized"},
        "compressed-tensors Q4_0x",
    ),
    (
        "mistral-ct-int8",
        "mistral",
        {},
        "compressed-tensors",
        {"bits": 8, "group_size": -1, "sym": True, "fmt": "int-quantized"},
        "compressed-tensors Q8_0x",
    ),
    (
        "llama-gptq_v2-8bit-g128",
        "llama",
        {"hidden_size": 128, "intermediate_size": 256},
        "gptq",
        {"bits": 8, "group_size": 128, "sym": True, "fmt": "gptq_v2"},
        "gptq Q8_0x",
    ),
]


@pytest.mark.parametrize(
    ("arch", "overrides", "method", "kwargs", "weights"),
    [c[1:] for c in MODEL_CASES],
    ids=[c[0] for c in MODEL_CASES],
)
def test_model_greedy_matches_the_dequantized_reference(
    tmp_path: Path, arch, overrides, method, kwargs, weights
) -> None:
    folder = make_tiny_model(arch, tmp_path / arch, **overrides)
    reference = quantize_checkpoint_as(folder, method, **kwargs)

    quantized = load_model(folder, TorchAttentionBackend(), quantization=method).model
    for layer in quantized.layers:
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            assert isinstance(layer.get_submodule(name), QuantLinear), name
    assert not isinstance(quantized.embed_tokens, QuantLinear)
    # The dense load is the formats' dequantization, exactly (the harness's, not ours).
    dense = load_model(folder, TorchAttentionBackend(), quantization="none").model
    rows = dense._shard_rows("qkv_proj", 1)
    k_ref = reference["model.layers.1.self_attn.k_proj.weight"]
    assert torch.equal(dense.layers[1].self_attn.qkv_proj.weight[rows], k_ref)
    assert torch.equal(dense.layers[0].mlp.down_proj.weight, reference["model.layers.0.mlp.down_proj.weight"])

    prompts = random_prompts(12, seed=3, max_len=40)
    got, runtime = _greedy(folder, "auto", prompts)
    expected, dense_runtime = _greedy(folder, "none", prompts)
    assert runtime["weights"].startswith(weights) and runtime["weights"].endswith("+ float32"), runtime
    assert dense_runtime["weights"] == "float32"
    drift = 5e-2 if "Q4_1" in weights else 1e-3
    for i, (ours, ref) in enumerate(zip(got, expected, strict=True)):
        for step, ((token, logprob, _), (ref_token, ref_logprob, ref_second)) in enumerate(
            zip(ours, ref, strict=True)
        ):
            if token != ref_token:
                assert ref_logprob - ref_second < drift, f"prompt {i} left the reference at step {step}"
                break
            assert abs(logprob - ref_logprob) < drift, f"prompt {i} step {step}: {logprob} vs {ref_logprob}"


def test_biased_projection_is_quantized_with_its_bias(tmp_path: Path) -> None:
    folder = make_tiny_model("qwen2", tmp_path / "m")
    quantize_checkpoint_as(folder, "gptq", bits=4, group_size=32, sym=True)  # Q4_0: the weights exactly
    threads = torch.get_num_threads()
    quantized = load_model(folder, TorchAttentionBackend(), quantization="gptq").model
    assert torch.get_num_threads() == threads  # the load's one-thread repack gives them back
    dense = load_model(folder, TorchAttentionBackend(), quantization="none").model
    qkv_q, qkv_d = quantized.layers[0].self_attn.qkv_proj, dense.layers[0].self_attn.qkv_proj
    assert isinstance(qkv_q, QuantLinear) and qkv_q.weight_type == "Q4_0"
    assert torch.equal(qkv_q.bias, qkv_d.bias) and qkv_d.bias.abs().min() > 0
    x = torch.randn(3, qkv_d.in_features)
    with torch.inference_mode():
        torch.testing.assert_close(qkv_q(x), qkv_d(x), rtol=1e-4, atol=1e-4)


def test_quantized_lm_head(tmp_path: Path) -> None:
    folder = make_tiny_model("qwen2", tmp_path / "m")  # untied head
    quantize_checkpoint_as(folder, "gptq", bits=4, group_size=32, sym=True, lm_head=True)
    quantized = load_model(folder, TorchAttentionBackend(), quantization="gptq").model
    dense = load_model(folder, TorchAttentionBackend(), quantization="none").model
    assert isinstance(quantized.lm_head, QuantLinear) and quantized.lm_head.weight_type == "Q4_0"
    hidden = torch.randn(4, dense.config.hidden_size)
    with torch.inference_mode():
        torch.testing.assert_close(
            quantized.compute_logits(hidden), dense.compute_logits(hidden), rtol=1e-4, atol=1e-4
        )


def test_sharded_checkpoint(tmp_path: Path) -> None:
    folder = make_tiny_model("llama", tmp_path / "m", max_shard_size="40KB")
    assert len(list(folder.glob("*.safetensors"))) > 2
    reference = quantize_checkpoint_as(folder, "awq", bits=4, group_size=32)
    model = load_model(folder, TorchAttentionBackend(), quantization="awq").model
    assert all(isinstance(layer.mlp.gate_up_proj, QuantLinear) for layer in model.layers)
    dense = load_model(folder, TorchAttentionBackend(), quantization="none").model
    assert torch.equal(
        dense.layers[2].self_attn.o_proj.weight, reference["model.layers.2.self_attn.o_proj.weight"]
    )


def test_gptq_zero_biases_are_skipped(tmp_path: Path) -> None:
    folder = make_tiny_model("llama", tmp_path / "m")
    quantize_checkpoint_as(folder, "gptq", bits=4, group_size=32, zero_biases=True)
    for quantization in ("gptq", "none"):
        model = load_model(folder, TorchAttentionBackend(), quantization=quantization).model
        assert model.layers[0].self_attn.qkv_proj.bias is None
    # A nonzero one on a model without biases is not silently dropped.
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    tensors = load_file(file)
    tensors["model.layers.0.self_attn.q_proj.bias"][0] = 1.0
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="unexpected tensors: model.layers.0.self_attn.q_proj.bias"):
        load_model(folder, TorchAttentionBackend(), quantization="gptq")


def test_quantize_config_json_beside_config_json(tmp_path: Path) -> None:
    """Older AutoGPTQ exports: the settings in quantize_config.json, no quant_method, no
    quantization_config in config.json."""
    folder = make_tiny_model("llama", tmp_path / "m")
    quantize_checkpoint_as(folder, "gptq", bits=4, group_size=32, sym=True)
    config = json.loads((folder / "config.json").read_text())
    settings = config.pop("quantization_config")
    del settings["quant_method"]
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "quantize_config.json").write_text(json.dumps(settings))
    model = load_model(folder, TorchAttentionBackend(), quantization="gptq").model
    assert isinstance(model.layers[0].mlp.down_proj, QuantLinear)


def test_desc_act_fused_parts_in_different_orders_are_refused_or_dense(tmp_path: Path) -> None:
    """q/k/v (or gate/up) whose act-orders differ cannot share one gathered input: refused under
    --quantization gptq naming desc_act, dense under auto (the rest stays quantized)."""
    folder = make_tiny_model("llama", tmp_path / "m")
    reference = quantize_checkpoint_as(folder, "gptq", bits=4, group_size=32, desc_act_permuted=True)
    with pytest.raises(ValueError, match=r"--quantization gptq: .*desc_act"):
        load_model(folder, TorchAttentionBackend(), quantization="gptq")
    model = load_model(folder, TorchAttentionBackend(), quantization="auto").model
    layer = model.layers[2]
    assert isinstance(layer.mlp.down_proj, QuantLinear) and layer.mlp.down_proj.input_order is not None
    assert not isinstance(layer.mlp.gate_up_proj, QuantLinear)
    gate = layer.mlp.gate_up_proj.weight[: model.config.intermediate_size]
    assert torch.equal(gate, reference["model.layers.2.mlp.gate_proj.weight"])  # dequantized exactly


def test_desc_act_with_unequal_groups_has_no_block_form() -> None:
    rng = np.random.default_rng(2)
    g_idx = np.sort(rng.integers(0, 4, 128))  # four groups of unequal sizes
    qz = rtn((rng.standard_normal((16, 128)) * 0.1).astype(np.float32), 4, 32, False, g_idx=g_idx)
    weight = read_linear(Scheme("gptq", 4, 32, "gptq"), gptq_tensors(qz), "layer")
    assert kernel_type(weight) == (None, "desc_act: its g_idx puts unequal numbers of inputs in its groups")
    assert torch.equal(weight.dequantize(), torch.from_numpy(dequantize(qz)))


def test_asymmetric_int8_is_refused_or_dequantized(tmp_path: Path) -> None:
    folder = make_tiny_model("llama", tmp_path / "m")
    quantize_checkpoint_as(folder, "gptq", bits=8, group_size=32, sym=False, fmt="gptq_v2")
    with pytest.raises(ValueError, match="asymmetric int8"):
        load_model(folder, TorchAttentionBackend(), quantization="gptq")
    model = load_model(folder, TorchAttentionBackend(), quantization="auto").model
    assert not any(isinstance(m, QuantLinear) for m in model.modules())


def test_unsupported_fields_are_named() -> None:
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}
    with pytest.raises(ValueError, match=r"gptq: quantization_config\.bits=3: only 4 and 8"):
        parse_scheme({"quantization_config": {**gptq, "bits": 3}})
    with pytest.raises(ValueError, match=r"checkpoint_format='marlin'"):
        parse_scheme({"quantization_config": {**gptq, "checkpoint_format": "marlin"}})
    with pytest.raises(ValueError, match=r"awq: quantization_config\.version='gemv'"):
        parse_scheme(
            {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}}
        )
    ct = {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
                "input_activations": {"num_bits": 8, "type": "int", "dynamic": True, "strategy": "token"},
            }
        },
    }
    with pytest.raises(ValueError, match=r"config_groups\.group_0\.input_activations"):
        parse_scheme({"quantization_config": ct})
    with pytest.raises(ValueError, match=r"quantization_status='frozen'"):
        parse_scheme({"quantization_config": {**ct, "quantization_status": "frozen"}})
    with pytest.raises(ValueError, match=r"format='float-quantized'"):
        parse_scheme({"quantization_config": {**ct, "format": "float-quantized"}})
    assert parse_scheme({"quantization_config": {"quant_method": "bitsandbytes"}}) is None
    assert parse_scheme({}) is None


def test_malformed_tensors_are_named() -> None:
    qz = rtn(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32), 4, 32, sym=False)
    tensors = gptq_tensors(qz)
    scheme = Scheme("gptq", 4, 32, "gptq")
    with pytest.raises(ValueError, match=r"layer\.qweight is torch\.int64; packed words are int32"):
        read_linear(scheme, {**tensors, "qweight": tensors["qweight"].long()}, "layer")
    with pytest.raises(ValueError, match=r"layer lacks layer\.qzeros"):
        read_linear(scheme, {k: v for k, v in tensors.items() if k != "qzeros"}, "layer")
    with pytest.raises(ValueError, match=r"layer\.scales: shape \(2, 8\), expected \(2, 16\)"):
        read_linear(scheme, {**tensors, "scales": tensors["scales"][:, :8]}, "layer")


def test_unsupported_bits_in_a_folder_is_refused_at_load(tmp_path: Path) -> None:
    folder = make_tiny_model("llama", tmp_path / "m")
    quantize_checkpoint_as(folder, "gptq", bits=4, group_size=32)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["bits"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    for quantization in ("auto", "none", "gptq"):
        with pytest.raises(ValueError, match=r"quantization_config\.bits=3"):
            load_model(folder, TorchAttentionBackend(), quantization=quantization)


def test_explicit_format_on_another_folder_is_refused(tmp_path: Path) -> None:
    plain = make_tiny_model("llama", tmp_path / "plain")
    with pytest.raises(
        ValueError, match="--quantization gptq: the checkpoint's config.json has no quantization_config"
    ):
        load_model(plain, TorchAttentionBackend(), quantization="gptq")
    awq = make_tiny_model("llama", tmp_path / "awq")
    quantize_checkpoint_as(awq, "awq", bits=4, group_size=32)
    with pytest.raises(ValueError, match="--quantization gptq: .* quantization_config.quant_method 'awq'"):
        load_model(awq, TorchAttentionBackend(), quantization="gptq")
    with pytest.raises(ValueError, match="--quantization gguf: .* has no GGUF weights"):
        load_model(awq, TorchAttentionBackend(), quantization="gguf")
    with pytest.raises(ValueError, match="--quantization awq: quantized weights run on the CPU with float32"):
        load_model(awq, TorchAttentionBackend(), quantization="awq", dtype="bfloat16")
    # auto on a worker that cannot run the kernel: dense, dequantized
    model = load_model(awq, TorchAttentionBackend(), quantization="auto", dtype="bfloat16").model
    assert not any(isinstance(m, QuantLinear) for m in model.modules())
