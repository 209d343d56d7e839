"""Load a Hugging Face checkpoint folder (config.json + *.safetensors) into our model modules."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch
from pagedserve.kernels.attention import AttentionBackend
from pagedserve.kernels.cpu.isa import forced_isa
from pagedserve.services.checkpoint import read_checkpoint
from pagedserve.services.worker.models.llama import LlamaForCausalLM
from pagedserve.services.worker.models.registry import ModelConfig, resolve
from pagedserve.services.worker.weights.checkpoint_files import (
    checkpoint_files,
    checkpoint_tensors,
    some_names,
)
from pagedserve.services.worker.weights.checkpoint_quant import parse_scheme
from pagedserve.services.worker.weights.quantized_load import (
    QUANTIZATIONS,
    install_checkpoint_quantized,
    keeps_checkpoint_quantized,
    one_thread,
    quantization_config,
    quantized_source,
)

__all__ = ["QUANTIZATIONS", "LoadedModel", "checkpoint_files", "load_model", "resolve_dtype", "torch_dtype"]

log = structlog.get_logger("pagedserve.loader")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass(slots=True)
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    eos_token_ids: tuple[int, ...]  # config.json's and generation_config.json's (services/checkpoint.py)


def cpu_has_fast_bf16() -> bool:
    """AMX or AVX512-BF16: bf16 matmuls run 2-3x faster than fp32 from batch 8 up on such CPUs."""
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return False
    if forced_isa() in ("avx2", "portable"):  # the ISA setting hides AVX-512 (tests, --emulate-isa)
        return False
    return bool({"amx_bf16", "avx512_bf16"} & set(flags.split()))


def resolve_dtype(name: str, device: torch.device | str) -> str:
    """`auto` -> bfloat16 where bf16 is fast (a CUDA GPU that supports it, a CPU with AMX or
    AVX512-BF16), else float32. Other names pass through (checked by torch_dtype)."""
    if name != "auto":
        return name
    device = torch.device(device)
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if device.type == "cpu" and cpu_has_fast_bf16() else "float32"


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


# vLLM's names for the checkpoint formats (services/worker/weights/checkpoint_quant.py) after ours.


def load_model(
    path: str | Path,
    backend: AttentionBackend,
    *,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    quantization: str = "none",
) -> LoadedModel:
    """quantization: `none` loads every weight dense in `dtype` (a GGUF's or a GPTQ/AWQ/compressed-tensors
    checkpoint's weights dequantized); `gguf` keeps the folder's GGUF weights in their stored types;
    `gptq` / `awq` / `compressed-tensors` keep such a checkpoint's linears quantized, repacked into the
    kernel's blocks, every one of them (ValueError where it cannot); `auto` keeps a GGUF, else such a
    checkpoint's linears, quantized where this worker can run them (CPU, float32, the kernel builds),
    dequantizing any linear that has no kernel format (logged), else loads dense."""
    folder = Path(path)
    checkpoint = read_checkpoint(folder)
    model_class, config = resolve(checkpoint.config)
    device = torch.device(device)
    gguf_file = quantized_source(folder, quantization, dtype, device)
    quant_config = {"quantization_config": quantization_config(folder, checkpoint.config)}
    scheme = parse_scheme(quant_config)
    keep = gguf_file is None and keeps_checkpoint_quantized(quant_config, scheme, quantization, dtype, device)
    # Built on the meta device: no memory and no random init for weights about to be overwritten.
    with torch.device("meta"):
        model = model_class(config, backend).to(dtype=torch_dtype(dtype))
    skip: set[str] = set()
    dense: Iterable[tuple[str, torch.Tensor]] = ()
    # A checkpoint format's repack and dequantization run on one thread (see one_thread); the dense
    # rest is dequantized one weight at a time as _fill_parameters reads it.
    with one_thread() if gguf_file is None and scheme is not None else nullcontext():
        if gguf_file is not None:
            from pagedserve.services.worker.weights.gguf_weights import read_gguf
            from pagedserve.services.worker.weights.quant_install import install_quantized

            skip = install_quantized(model, read_gguf(gguf_file))
        elif scheme is not None:
            skip, dense = install_checkpoint_quantized(
                model, folder, scheme, keep, strict=quantization == scheme.method
            )
        model.to_empty(device=device)
        _fill_parameters(model, folder, skip, dense)
    model.eval().requires_grad_(False)
    return LoadedModel(model, config, checkpoint.eos_token_ids)


def _fill_parameters(
    model: LlamaForCausalLM,
    folder: Path,
    skip: set[str] | None = None,
    extra: Iterable[tuple[str, torch.Tensor]] = (),
) -> None:
    """skip: checkpoint tensors already in the model in another form (quantized weights); extra: tensors
    to fill besides the folder's (dequantized weights, by their Hugging Face names)."""
    params = dict(model.named_parameters())
    seen: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in itertools.chain(checkpoint_tensors(folder, skip or set()), extra):
        target = model.checkpoint_target(name)
        if target is None:
            continue
        param_name, rows = target
        param = params.get(param_name)
        if param is None:
            unexpected.append(name)
            continue
        dest = param.data if rows is None else param.data[rows]
        if dest.shape != tensor.shape:
            raise ValueError(
                f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, the model expects {tuple(dest.shape)}"
            )
        dest.copy_(tensor)  # converts to the model's dtype and device
        seen.update(model.checkpoint_names_filled_by(name))
    if unexpected:
        raise ValueError(
            f"checkpoint in {folder} has {len(unexpected)} unexpected tensors: {some_names(unexpected)}"
        )
    missing = [n for n in model.checkpoint_names() if n not in seen]
    if missing:
        raise ValueError(f"checkpoint in {folder} lacks {len(missing)} tensors: {some_names(missing)}")
