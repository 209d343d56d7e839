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
        if not (folder / "adapter_config.json").is_file() and not (
            folder.is_file() and folder.suffix == ".gguf"
        ):
            raise ValueError(
                f"lora_path {path!r}: neither a PEFT adapter folder (no adapter_config.json there) nor a "
                ".gguf adapter file"
            )
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
