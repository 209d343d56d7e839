"""The LoRA adapters a deployment serves, by name: what a request's `model` / `lora` field may pick.

An adapter is part of a request's identity: its KV is computed under other weights. Each load gets
a fresh *cache namespace* (`name#load`), which the block manager roots the request's prefix-cache
chain at, so KV computed under one adapter (or under an earlier load of the same name, whose files
may have changed) is never served to another. Workers learn adapters from the requests themselves
(NewRequest carries name and path), so a fresh or restarted worker needs nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

NAME_MAX = 256


@dataclass(frozen=True, slots=True)
class LoRAModule:
    name: str
    path: str
    namespace: str  # the prefix-cache namespace of this load


class LoRARegistry:
    def __init__(self, check: Callable[[str], None] | None = None) -> None:
        """check(path): raises ValueError for an adapter this deployment cannot serve (check_adapter)."""
        self.modules: dict[str, LoRAModule] = {}
        self.check = check
        self._loads = 0

    def add(self, name: str, path: str) -> LoRAModule:
        """Register `name` (ValueError naming what is wrong: a bad name, a taken one, a missing folder)."""
        if not name or len(name) > NAME_MAX or any(c.isspace() for c in name):
            raise ValueError(f"lora_name must be 1-{NAME_MAX} characters without spaces; got {name!r}")
        if name in self.modules:
            raise ValueError(f"lora_name {name!r} is already loaded (from {self.modules[name].path})")
        folder = Path(path)
        if not (folder / "adapter_config.json").is_file():
            raise ValueError(f"lora_path {path!r}: no adapter_config.json there (a PEFT adapter folder)")
        if self.check is not None:
            self.check(str(folder))
        self._loads += 1
        module = LoRAModule(name, str(folder.resolve()), f"{name}#{self._loads}")
        self.modules[name] = module
        return module

    def remove(self, name: str) -> LoRAModule:
        module = self.modules.pop(name, None)
        if module is None:
            raise KeyError(f"lora_name {name!r} is not loaded")
        return module

    def get(self, name: str) -> LoRAModule | None:
        return self.modules.get(name)

    def names(self) -> list[str]:
        return sorted(self.modules)


def parse_lora_modules(specs: list[str]) -> list[tuple[str, str]]:
    """`--lora-modules name=path ...` -> [(name, path)]; ValueError names a malformed entry."""
    pairs = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"lora_modules: {spec!r} must be name=path")
        pairs.append((name, path))
    return pairs


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def check_adapter(path: str | Path, hf_config: dict, max_rank: int) -> None:
    """Check a PEFT adapter against the base model's config.json without reading its weights (the
    safetensors header holds every tensor's shape): ValueError naming the file or module that does
    not fit. The worker checks the same again when it loads the weights."""
    import json
    import re
    import struct

    folder = Path(path)
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
    hidden, heads = hf_config["hidden_size"], hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, (hf_config.get("num_key_value_heads") or heads) * head_dim
    inter, layers = hf_config["intermediate_size"], hf_config["num_hidden_layers"]
    dims = {  # projection -> (in, out)
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
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
