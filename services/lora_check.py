"""A LoRA adapter checked against the base model's config.json without reading its weights: what the
scheduler does when an adapter is registered (--lora-modules, the load endpoint), so that a bad one is
refused there, naming the file or module, before any request names it. The worker checks the same
again when it reads the weights (services/worker/weights/lora_adapter.py).

Two forms: a PEFT folder (the safetensors header holds every tensor's shape), and a `.gguf` file from
llama.cpp's convert_lora_to_gguf.py (its tensor table holds them: services/gguf_file.py).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from pagedserve.services.gguf_file import GGUFError, is_gguf_file, read_header

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def check_adapter(path: str | Path, hf_config: dict, max_rank: int) -> None:
    """ValueError naming the file or module of the adapter at `path` that does not fit the model."""
    folder = Path(path)
    if is_gguf_file(folder):
        return _check_gguf_adapter(folder, hf_config, max_rank)
    config_file, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"LoRA adapter {config_file}: unreadable ({exc})") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA" or config.get("use_dora"):
        raise ValueError(
            f"LoRA adapter {config_file}: only plain LoRA (peft_type LORA, no DoRA) is supported"
        )
    try:
        with weights.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > 100 << 20:
                raise ValueError(f"header of {size} bytes")
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise ValueError(f"LoRA adapter {weights}: not a readable safetensors file ({exc})") from None
    dims, layers = _projection_dims(hf_config)
    found = False
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        m = re.fullmatch(
            r"(?:base_model\.model\.)?(model\.layers\.(\d+)\.\w+\.(\w+))\.lora_([AB])(?:\.\w+)?\.weight", key
        )
        if m is None or m.group(3) not in dims or int(m.group(2)) >= layers:
            raise ValueError(
                f"LoRA adapter {weights}: tensor {key!r} is not a LoRA weight of a projection this model has "
                f"({', '.join(PROJECTIONS)} in layers 0-{layers - 1})"
            )
        shape = meta.get("shape", [])
        fan_in, fan_out = dims[m.group(3)]
        rank = shape[0] if m.group(4) == "A" else (shape[1] if len(shape) == 2 else -1)
        expected = [rank, fan_in] if m.group(4) == "A" else [fan_out, rank]
        if len(shape) != 2 or shape != expected:
            raise ValueError(
                f"LoRA adapter {weights}: module {m.group(1)} lora_{m.group(4)} has shape {shape}; "
                f"the base model needs {expected}"
            )
        if rank > max_rank:
            raise ValueError(
                f"LoRA adapter {weights}: module {m.group(1)} has rank {rank} > max_lora_rank {max_rank}"
            )
        found = True
    if not found:
        raise ValueError(f"LoRA adapter {weights}: holds no lora_A/lora_B weights")


def _projection_dims(hf_config: dict) -> tuple[dict[str, tuple[int, int]], int]:
    """projection -> (in, out), and the number of layers."""
    hidden, heads = hf_config["hidden_size"], hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, (hf_config.get("num_key_value_heads") or heads) * head_dim
    inter = hf_config["intermediate_size"]
    dims = {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    return dims, hf_config["num_hidden_layers"]


# llama.cpp's names of the projections (Phi-3's fused attn_qkv and gate+up ffn_up are checked by the
# worker, which knows the fused layout).
_GGUF_PROJECTIONS = {
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_output": "o_proj",
    "ffn_gate": "gate_proj",
    "ffn_up": "up_proj",
    "ffn_down": "down_proj",
}


def _check_gguf_adapter(path: Path, hf_config: dict, max_rank: int) -> None:
    try:
        header = read_header(path)
    except GGUFError as exc:
        raise ValueError(f"LoRA adapter {exc}") from None
    meta = header.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise ValueError(
            f"LoRA adapter {path}: not a LoRA adapter file (general.type {meta.get('general.type')!r}, "
            f"adapter.type {meta.get('adapter.type')!r})"
        )
    dims, layers = _projection_dims(hf_config)
    fused = hf_config.get("architectures", [""])[0] == "Phi3ForCausalLM"
    for info in header.tensors:
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight\.lora_([ab])", info.name)
        if m is None or int(m.group(1)) >= layers or (m.group(2) not in _GGUF_PROJECTIONS and not fused):
            raise ValueError(
                f"LoRA adapter {path}: tensor {info.name!r} is not a LoRA weight of a projection this model "
                f"has ({', '.join(_GGUF_PROJECTIONS)} in layers 0-{layers - 1})"
            )
        if len(info.dims) != 2:
            raise ValueError(f"LoRA adapter {path}: tensor {info.name} has dims {list(info.dims)}")
        # ggml order: lora_a is [in, r], lora_b [r, out]
        rank = info.dims[1] if m.group(3) == "a" else info.dims[0]
        projection = _GGUF_PROJECTIONS.get(m.group(2))
        if projection is not None and not (fused and m.group(2) == "ffn_up"):
            fan_in, fan_out = dims[projection]
            expected = [fan_in, rank] if m.group(3) == "a" else [rank, fan_out]
            if list(info.dims) != expected:
                raise ValueError(
                    f"LoRA adapter {path}: {info.name} has ggml dims {list(info.dims)}; the base model "
                    f"needs {expected}"
                )
        if rank > max_rank:
            raise ValueError(f"LoRA adapter {path}: {info.name} has rank {rank} > max_lora_rank {max_rank}")
    if not header.tensors:
        raise ValueError(f"LoRA adapter {path}: holds no lora_a/lora_b tensors")
