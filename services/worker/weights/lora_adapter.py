"""PEFT LoRA adapters (adapter_config.json + adapter_model.safetensors) read and fitted to our model.

A PEFT adapter holds, per target module, A [r, in] and B [out, r]; the module's output gains
`scale * (x A^T) B^T` with scale = alpha / r (rsLoRA: alpha / sqrt(r)), alpha and r per module where
`alpha_pattern` / `rank_pattern` say so. Our model fuses q/k/v and gate/up into one matrix each, so an
adapter is *packed* per fused module as a list of parts (which part of the fused output, its A, its
scaled B); the LoRA linear copies them into its slot stacks (layers/lora.py). A part the adapter does
not target is left out (zeros in the stacks).

Everything is checked against the model before anything is kept: an unknown or unsupported target, a
shape that does not fit, a rank above the limit or a file that does not parse raises `AdapterError`
naming the module or file, and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pagedserve.services.gguf_file import is_gguf_file
from pagedserve.services.worker.weights.lora_gguf import (
    BASE_ARCHITECTURES,
    GGUFAdapterError,
    read_gguf_adapter,
)
from pagedserve.shared import failpoints

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pagedserve.services.worker.layers.lora import LoRALinear
    from pagedserve.services.worker.models.llama import LlamaForCausalLM

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


class AdapterError(ValueError):
    """An adapter that cannot be served on this model; the message names the file or module."""


@dataclass(frozen=True, slots=True)
class PackedLoRA:
    """One adapter's weights for one of our linears: delta = (x a^T) bt (the scale is in bt)."""

    # (index of the part in the linear's parts, A [r, in_features], scaled B^T [r, part's out rows]),
    # contiguous: B is transposed here, in the read, so filling a slot inside a step is plain
    # copies (transposing copies made a hot load's fill 12-17 ms of its step on SmolLM2, Zen 3).
    parts: tuple[tuple[int, torch.Tensor, torch.Tensor], ...]


@dataclass(frozen=True, slots=True)
class LoRAAdapter:
    name: str
    path: str
    rank: int  # the largest rank of any module
    modules: dict[str, PackedLoRA]  # our module path (layers.0.self_attn.qkv_proj) -> weights

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for p in self.modules.values() for _, a, b in p.parts)


# A read under way (read_lora_adapter): each next() does one slice; the last returns the adapter.
AdapterRead = Generator[None, None, LoRAAdapter]


@dataclass(frozen=True, slots=True)
class Tensors:
    """An open adapter file: its tensor names, and a tensor read by name."""

    names: list[str]
    get: Callable[[str], torch.Tensor]


def read_adapter_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not folder.is_dir():
        raise AdapterError(
            f"LoRA adapter {folder}: not a folder (a PEFT adapter is a folder with {CONFIG_FILE})"
        )
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise AdapterError(f"LoRA adapter {folder}: no {CONFIG_FILE}") from None
    except (OSError, ValueError) as exc:
        raise AdapterError(f"LoRA adapter {path}: unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"LoRA adapter {path}: must be a JSON object")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise AdapterError(f"LoRA adapter {path}: peft_type {peft_type!r} is not supported (only LORA)")
    unsupported = {
        "use_dora": "DoRA",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D weights)",
        "modules_to_save": "modules_to_save (fully trained modules)",
    }
    for key, what in unsupported.items():
        if config.get(key):
            raise AdapterError(f"LoRA adapter {path}: {what} is not supported")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"LoRA adapter {path}: bias={config['bias']!r} is not supported (only 'none')")
    return config


@contextmanager
def open_adapter_tensors(folder: Path) -> Iterator[Tensors]:
    """The adapter's safetensors file, open: its tensor names, each tensor read when asked for (so that
    a read can be cut into slices). The kernel is asked to read the file ahead, so that a slice finds
    its bytes in the page cache rather than waiting on the disk."""
    from safetensors import SafetensorError, safe_open

    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise AdapterError(f"LoRA adapter {folder}: no {WEIGHTS_FILE} (only safetensors adapters are read)")
    _read_ahead(path)
    unreadable = (SafetensorError, OSError, ValueError, RuntimeError)
    try:
        handle = safe_open(str(path), framework="pt")
        names = list(handle.keys())
    except unreadable as exc:
        raise AdapterError(f"LoRA adapter {path}: not a readable safetensors file ({exc})") from None

    def tensor(key: str) -> torch.Tensor:
        try:
            return handle.get_tensor(key)
        except unreadable as exc:
            raise AdapterError(f"LoRA adapter {path}: tensor {key!r} is unreadable ({exc})") from None

    with handle:
        yield Tensors(names, tensor)


def _read_ahead(path: Path) -> None:
    with contextlib.suppress(OSError, AttributeError):  # a hint only (AttributeError: not on this OS)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    """PEFT's rank_pattern / alpha_pattern: a key matches the module name or a dotted suffix of it."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def finish_read(read: AdapterRead) -> LoRAAdapter:
    """The rest of a read (read_lora_adapter), at once."""
    while True:
        try:
            next(read)
        except StopIteration as done:
            return done.value


def read_lora_adapter(
    name: str,
    path: str | Path,
    model: LlamaForCausalLM,
    targets: Mapping[str, LoRALinear],
    *,
    max_rank: int,
    dtype: torch.dtype,
) -> AdapterRead:
    """Read and pack an adapter for `model`: a PEFT folder, or a `.gguf` file from llama.cpp's
    convert_lora_to_gguf.py (lora_gguf.py). `targets`: our module path -> the linear it adapts.

    A generator that pauses after opening the files and after each module (a fraction of a millisecond
    on SmolLM2 at rank 16) and returns the adapter: the worker spreads a read over the gaps between
    steps (lora_slots.py), PEFT and GGUF files alike."""
    source = Path(path)
    with _adapter_pairs(source, model) as (pairs, tensor, scale):
        yield
        parts: dict[str, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
        for module, ab in sorted(pairs.items()):
            ours, part, a, b = _fitted(source, module, ab, tensor, model, targets, max_rank)
            scaled_bt = b.to(torch.float32).t() * scale(module, a.shape[0])
            parts.setdefault(ours, []).append((part, _weight(a, dtype), _weight(scaled_bt, dtype)))
            yield
    failpoints.fire("worker.lora_load")  # read and packed, not yet kept: chaos kills a worker here
    rank = max(a.shape[0] for linear_parts in parts.values() for _, a, _ in linear_parts)
    return LoRAAdapter(name, str(source), rank, {ours: PackedLoRA(tuple(p)) for ours, p in parts.items()})


def _fitted(
    source: Path,
    module: str,
    ab: dict[str, str],
    tensor: Callable[[str], torch.Tensor],
    model: LlamaForCausalLM,
    targets: Mapping[str, LoRALinear],
    max_rank: int,
) -> tuple[str, int, torch.Tensor, torch.Tensor]:
    """One module's pair checked against the linear it adapts -> (our module, the part it fills, A, B)."""
    if set(ab) != {"A", "B"}:
        raise AdapterError(f"LoRA adapter {source}: module {module} lacks lora_{'B' if 'A' in ab else 'A'}")
    target = model.checkpoint_target(module + ".weight")
    ours = None if target is None else target[0].removesuffix(".weight")
    if target is None or ours is None or ours not in targets:
        raise AdapterError(
            f"LoRA adapter {source}: module {module} is not one this server adapts "
            "(the attention and MLP projections: q/k/v/o_proj, gate/up/down_proj)"
        )
    linear = targets[ours]
    rows = target[1] or slice(0, linear.out_features)
    layout = getattr(linear, "parts", [slice(0, linear.out_features)])
    if not isinstance(rows, slice) or rows not in layout:  # a tuple: an expert's slice of a stack
        where = f"rows {rows.start}:{rows.stop}" if isinstance(rows, slice) else f"the part {rows}"
        raise AdapterError(
            f"LoRA adapter {source}: module {module} fills {where} of {ours}, which is not one of its parts"
        )
    a, b = tensor(ab["A"]), tensor(ab["B"])
    rank = a.shape[0]
    out = rows.stop - rows.start
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != linear.in_features or b.shape != (out, rank):
        raise AdapterError(
            f"LoRA adapter {source}: module {module} has lora_A {tuple(a.shape)} and lora_B "
            f"{tuple(b.shape)}; the base model needs [r, {linear.in_features}] and [{out}, r]"
        )
    if rank > max_rank:
        raise AdapterError(
            f"LoRA adapter {source}: module {module} has rank {rank} > max_lora_rank {max_rank}"
        )
    return ours, layout.index(rows), a, b


# A format reader's result: module (Hugging Face name) -> {"A": tensor name, "B": tensor name}, how to
# read a tensor by its name, and the scale of a module's delta given its rank.
Pairs = dict[str, dict[str, str]]
Scale = Callable[[str, int], float]


@contextmanager
def _adapter_pairs(
    source: Path, model: LlamaForCausalLM
) -> Iterator[tuple[Pairs, Callable[[str], torch.Tensor], Scale]]:
    if is_gguf_file(source):
        yield _gguf_pairs(source, model)
        return
    config = read_adapter_config(source)
    with open_adapter_tensors(source) as tensors:
        yield _peft_pairs(source, tensors.names), tensors.get, _peft_scale(config)


def _peft_pairs(folder: Path, names: list[str]) -> Pairs:
    pairs: Pairs = {}
    for key in names:
        match = re.fullmatch(r"(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
        if match is None:
            what = (
                "full weights of a trained module"
                if ".base_layer." in key or "lora_" not in key
                else "a tensor"
            )
            raise AdapterError(
                f"LoRA adapter {folder / WEIGHTS_FILE}: {what} is not supported ({key!r}); only lora_A/lora_B "
                "of the attention and MLP projections are"
            )
        module = match.group(1).removeprefix(PEFT_PREFIX)
        pairs.setdefault(module, {})[match.group(2)] = key
    if not pairs:
        raise AdapterError(f"LoRA adapter {folder / WEIGHTS_FILE}: holds no lora_A/lora_B weights")
    return pairs


def _peft_scale(config: dict[str, Any]) -> Scale:
    alpha = float(config.get("lora_alpha", config.get("r", 8)))
    rslora = bool(config.get("use_rslora", False))
    patterns = config.get("alpha_pattern") or {}

    def scale(module: str, rank: int) -> float:
        module_alpha = float(_pattern_value(patterns, module, alpha))
        return module_alpha / (math.sqrt(rank) if rslora else rank)

    return scale


def _gguf_pairs(path: Path, model: LlamaForCausalLM) -> tuple[Pairs, Callable[[str], torch.Tensor], Scale]:
    cfg = model.config
    try:
        adapter = read_gguf_adapter(path, cfg.num_heads, cfg.num_kv_heads)
    except GGUFAdapterError as exc:
        raise AdapterError(f"LoRA adapter {exc}") from None
    made_for = BASE_ARCHITECTURES.get(adapter.architecture, set())
    if cfg.architecture not in made_for:
        raise AdapterError(
            f"LoRA adapter {path}: made for a {adapter.architecture!r} model (general.architecture); "
            f"this one is {cfg.architecture}"
        )

    def tensor(key: str) -> torch.Tensor:  # key: "<module>.<side>", as the pairs name them
        module, side = key.rsplit(".", 1)
        try:
            return adapter.values(module, side)
        except GGUFAdapterError as exc:
            raise AdapterError(f"LoRA adapter {exc}") from None

    pairs = {module: {side: f"{module}.{side}" for side in ab} for module, ab in adapter.pairs.items()}
    return pairs, tensor, lambda _module, rank: adapter.alpha / rank


def _weight(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(torch.float32).to(dtype).contiguous()
