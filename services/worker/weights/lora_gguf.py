"""LoRA adapters as llama.cpp users have them: one `.gguf` file written by llama.cpp's
convert_lora_to_gguf.py, read here into the same (A, B) pairs a PEFT folder gives.

Such a file says `general.type = adapter`, `adapter.type = lora`, its base model's
`general.architecture`, and one `adapter.lora.alpha`; per adapted matrix it holds `<name>.lora_a`
([r, in]) and `<name>.lora_b` ([out, r]) under llama.cpp's tensor names (`blk.3.attn_q.weight`), in
F32, F16, BF16 or Q8_0 (the converter's --outtype). What the conversion keeps is what llama.cpp
applies: every pair scaled by alpha / r, r its own rank. PEFT's rank_pattern, alpha_pattern and
rsLoRA do not survive it, so they are not looked for here.

The converter reorders the rows of a Llama model's q and k projections as it does the base model's
(gguf_weights.py), and B's rows are those outputs: they are put back into Hugging Face's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pagedserve.services.gguf_config import GGUF_ARCHITECTURES
from pagedserve.services.gguf_file import GGUFError, TensorInfo, read_header
from pagedserve.services.worker.weights.gguf_weights import hf_name, qk_row_order, tensor_values

_SUFFIXES = {".lora_a": "A", ".lora_b": "B"}
# llama.cpp's architecture names -> the Hugging Face ones its converter writes them for: an adapter is read
# only onto a base of its own architecture. GGUF_ARCHITECTURES' own, and what llama.cpp converts under
# another name (Mistral and Mixtral as llama) or we serve only from a folder (OLMoE).
BASE_ARCHITECTURES = {arch: {entry.hf_architecture} for arch, entry in GGUF_ARCHITECTURES.items()}
BASE_ARCHITECTURES["llama"] |= {"MistralForCausalLM", "MixtralForCausalLM"}
BASE_ARCHITECTURES["olmoe"] = {"OlmoeForCausalLM"}


class GGUFAdapterError(ValueError):
    """A .gguf file that is not a LoRA adapter this server reads; the message says why."""


@dataclass(frozen=True, slots=True)
class GGUFAdapter:
    """An adapter file's header: its pairs by the Hugging Face module name
    (`model.layers.0.self_attn.q_proj`) and side, each tensor read from the file when asked for
    (`values`), so that a read can be cut into slices."""

    path: Path
    alpha: float
    architecture: str
    pairs: dict[str, dict[str, TensorInfo]]
    num_heads: int  # the base model's, for its q/k row order
    num_kv_heads: int

    def values(self, module: str, side: str) -> torch.Tensor:
        info = self.pairs[module][side]
        values = _values(self.path, info)
        if side == "B":  # its rows are the projection's outputs, reordered as the base model's were
            try:
                order = qk_row_order(
                    self.architecture, module + ".weight", values.shape[0], self.num_heads, self.num_kv_heads
                )
            except ValueError:
                raise GGUFAdapterError(
                    f"{self.path}: {info.name} has {tuple(values.shape)}: its rows are not whole heads of the "
                    f"base model ({self.num_heads} query, {self.num_kv_heads} key/value heads)"
                ) from None
            if order is not None:
                values = values[torch.from_numpy(order)]
        return values


def read_gguf_adapter(path: Path, num_heads: int, num_kv_heads: int) -> GGUFAdapter:
    """The adapter in `path` (its header: the tensors are read by GGUFAdapter.values);
    num_heads / num_kv_heads: the base model's, for its q/k row order."""
    try:
        header = read_header(path)
    except GGUFError as exc:
        raise GGUFAdapterError(str(exc)) from None
    meta = header.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise GGUFAdapterError(
            f"{path} is not a LoRA adapter: general.type {meta.get('general.type')!r}, adapter.type "
            f"{meta.get('adapter.type')!r} (llama.cpp's convert_lora_to_gguf.py writes 'adapter', 'lora')"
        )
    if meta.get("adapter.alora.invocation_tokens"):
        raise GGUFAdapterError(f"{path} is an activated LoRA (aLoRA): not supported, only plain LoRA is")
    alpha, architecture = meta.get("adapter.lora.alpha"), str(meta.get("general.architecture", ""))
    if not isinstance(alpha, (int, float)):
        raise GGUFAdapterError(f"{path} has no adapter.lora.alpha")
    pairs: dict[str, dict[str, TensorInfo]] = {}
    for info in header.tensors:
        stem, side = _split_name(info.name)
        hf = hf_name(stem, architecture) if side else None
        if hf is None or side is None:
            raise GGUFAdapterError(
                f"{path}: tensor {info.name!r} is not supported; only the lora_a/lora_b pairs of the "
                "attention and MLP projections are"
            )
        pairs.setdefault(hf.removesuffix(".weight"), {})[side] = info
    if not pairs:
        raise GGUFAdapterError(f"{path} holds no lora_a/lora_b tensors")
    return GGUFAdapter(path, float(alpha), architecture, pairs, num_heads, num_kv_heads)


def _split_name(name: str) -> tuple[str, str | None]:
    """`blk.0.attn_q.weight.lora_a` -> (`blk.0.attn_q.weight`, "A"); a name without a side: (name, None)."""
    for suffix, side in _SUFFIXES.items():
        if name.endswith(suffix):
            return name.removesuffix(suffix), side
    return name, None


def _values(path: Path, info: TensorInfo) -> torch.Tensor:
    """A tensor's values in PyTorch's shape, read from the file (gguf_weights.tensor_values)."""
    with path.open("rb") as f:
        f.seek(info.start)
        raw = np.frombuffer(bytearray(f.read(info.nbytes)), dtype=np.uint8)  # writable: torch wants it
    if len(raw) != info.nbytes:
        raise GGUFAdapterError(f"{path}: tensor {info.name} runs past the end of the file")
    return tensor_values(raw.reshape(info.rows, -1), info)
