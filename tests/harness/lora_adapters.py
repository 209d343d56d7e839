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
