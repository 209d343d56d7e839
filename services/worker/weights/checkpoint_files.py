"""A checkpoint folder's safetensors shards and the tensors in them, read one at a time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors shards: those the index names when there is one, else every *.safetensors."""
    index_file = folder / "model.safetensors.index.json"
    if index_file.is_file():
        weight_map: dict[str, str] = json.loads(index_file.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(f"{index_file.name} names shards that are missing: {', '.join(absent)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    return files


def checkpoint_tensors(
    folder: Path, skip: frozenset[str] | set[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint but those named in `skip` (which are not even read)."""
    for file in checkpoint_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name not in skip:
                    yield name, f.get_tensor(name)


def some_names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (f" (and {len(names) - limit} more)" if len(names) > limit else "")
