"""PEFT LoRA adapters for the tiny test models, made with `peft` itself, and their merged references.

B is random (PEFT's default init makes it zero, which would hide every mistake), with the scale chosen
so an adapter moves the logits well beyond the comparison tolerance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_peft_adapter(
    base: Path,
    out: Path,
    *,
    seed: int = 0,
    rank: int = 8,
    alpha: float = 16.0,
    targets: tuple[str, ...] = ALL_PROJECTIONS,
    **lora_config: Any,
) -> Path:
    """Write a PEFT adapter folder for the checkpoint at `base` -> `out`."""
    import peft
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False, **lora_config
    )
    torch.manual_seed(seed)
    peft_model = peft.get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    peft_model.save_pretrained(out)
    return out


def merged_model(base: Path, adapter: Path | None) -> Any:
    """transformers' model with the adapter merged into its weights (PEFT's merge_and_unload)."""
    import peft
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        base, attn_implementation="eager", dtype=torch.float32
    )
    if adapter is None:
        return model.eval()
    return peft.PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()


def peft_to_gguf(adapter: Path, base: Path, out: Path, outtype: str = "F32") -> Path:
    """The PEFT adapter at `adapter` written as llama.cpp's convert_lora_to_gguf.py writes one (our own
    writer, from the format: the converter itself runs in test_lora_gguf.py where it is installed):
    general.type adapter, adapter.type lora, adapter.lora.alpha; `<tensor>.lora_a` / `.lora_b` under
    llama.cpp's names, B's q/k rows in llama.cpp's order for a Llama base; outtype F32, F16 or Q8_0."""
    import json

    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    from harness.gguf_models import GGUF_ARCH, gguf_name, llama_permute

    config = json.loads((base / "config.json").read_text())
    arch = GGUF_ARCH[config["architectures"][0]]
    peft_config = json.loads((adapter / "adapter_config.json").read_text())
    writer = gguf.GGUFWriter(out, arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(peft_config["lora_alpha"]))
    kind = gguf.GGMLQuantizationType[outtype]
    for key, values in sorted(load_file(adapter / "adapter_model.safetensors").items()):
        # base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
        module, side = key.removeprefix("base_model.model.").split(".lora_")
        name = f"{gguf_name(module + '.weight')}.lora_{side[0].lower()}"
        values = values.astype(np.float32)
        if side[0] == "B" and arch == "llama" and module.endswith(("q_proj", "k_proj")):
            values = llama_permute(
                values, config["num_attention_heads" if module.endswith("q_proj") else "num_key_value_heads"]
            )
        # As the converter does: a row that is not whole quantization blocks (B's, of rank r) stays F16.
        block = gguf.GGML_QUANT_SIZES[kind][0]
        this = kind if values.shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16
        if this == gguf.GGMLQuantizationType.F16:
            values = values.astype(np.float16)
        elif this != gguf.GGMLQuantizationType.F32:
            values = gguf.quants.quantize(values, this)
        writer.add_tensor(name, np.ascontiguousarray(values), raw_dtype=this)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
