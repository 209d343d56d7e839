"""Load a model into our modules: a Hugging Face checkpoint folder (config.json + *.safetensors, perhaps
a GGUF beside them) or a GGUF model (a .gguf file or split set, memory-mapped; see gguf_weights.py)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import torch

from pagedserve.kernels.attention import AttentionBackend
from pagedserve.services.checkpoint import read_checkpoint
from pagedserve.services.worker.auto_dtype import auto_cpu_dtype
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
    keeps_gguf,
    one_thread,
    quantization_config,
)

if TYPE_CHECKING:
    from pagedserve.services.worker.tensor_parallel.shard import RankShard

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
    tokenizer_path: Path | None = None  # the checkpoint's: a folder, or the GGUF holding it


def resolve_dtype(name: str, device: torch.device | str) -> str:
    """`auto` -> bfloat16 where bf16 is the faster dtype (a CUDA GPU that supports it; on a CPU, the
    rule of services/worker/auto_dtype.py: AMX, or AVX512-BF16 where a cached probe measured it
    faster), else float32; logged with the reason. Other names pass through (checked by torch_dtype)."""
    if name != "auto":
        return name
    device = torch.device(device)
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if device.type != "cpu":
        return "float32"
    choice = auto_cpu_dtype()
    log.info("dtype auto", chose=choice.dtype, reason=choice.reason)
    return choice.dtype


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
    shard: RankShard | None = None,
    quant_activations: str | None = None,
) -> LoadedModel:
    """path: a checkpoint folder or a .gguf file (services/checkpoint.py resolve_model).

    quantization: `none` loads every weight dense in `dtype` (a GGUF's or a GPTQ/AWQ/compressed-tensors
    checkpoint's weights dequantized in memory); `gguf` keeps the model's GGUF weights in their stored
    types; `gptq` / `awq` / `compressed-tensors` keep such a checkpoint's linears quantized, repacked into
    the kernel's blocks, every one of them (ValueError where it cannot); `auto` keeps a GGUF, else such a
    checkpoint's linears, quantized where this worker can run them (CPU, float32, the kernel builds),
    dequantizing any linear that has no kernel format (logged), else loads dense.

    shard: a tensor-parallel rank's part (tensor_parallel/shard.py): the model is built from its
    smaller config and every checkpoint tensor cut to it; loaded dense (packed blocks are not cut).
    quant_activations: how the linears kept quantized take their activations (float32 or int8; None:
    the PAGEDSERVE_QUANT_ACTIVATIONS variable, else float32)."""
    checkpoint = read_checkpoint(Path(path))
    folder = checkpoint.path if checkpoint.path.is_dir() else None
    model_class, whole = resolve(checkpoint.config)
    config = whole if shard is None else shard.local_config(whole)
    if shard is not None and quantization != "none":  # ServeConfig admits only auto here
        log.info("quantization none", reason="a tensor-parallel rank loads its slice of the weights dense")
        quantization = "none"
    device = torch.device(device)
    keep_gguf = keeps_gguf(checkpoint.gguf_files, quantization, dtype, device)
    quant_config = {"quantization_config": quantization_config(folder, checkpoint.config) if folder else None}
    scheme = parse_scheme(quant_config)
    # A GGUF has no quantization_config: an explicit gptq/awq/compressed-tensors is refused, naming that.
    keep = keeps_checkpoint_quantized(quant_config, scheme, quantization, dtype, device)
    # Built on the meta device: no memory and no random init for weights about to be overwritten.
    with torch.device("meta"):
        model = model_class(config, backend).to(dtype=torch_dtype(dtype))
    skip: set[str] = set()
    dense: Iterable[tuple[str, torch.Tensor]] = ()
    offset_stored = False  # the norms read hold Gemma's 1 + w already (gguf_weights.UNIT_OFFSET_STORED)
    # A checkpoint format's repack and dequantization run on one thread (see one_thread); the dense
    # rest is dequantized one weight at a time as _fill_parameters reads it.
    with one_thread() if not checkpoint.gguf_files and scheme is not None else nullcontext():
        if checkpoint.gguf_files:
            from pagedserve.services.worker.weights.gguf_weights import (
                UNIT_OFFSET_STORED,
                dense_tensors,
                map_gguf,
                quantized_tensors,
            )
            from pagedserve.services.worker.weights.quant_install import install_quantized

            mapped = map_gguf(checkpoint.gguf_files)
            if keep_gguf:
                try:
                    tensors = quantized_tensors(mapped, strict=quantization == "gguf")
                    skip = install_quantized(model, tensors, activations=quant_activations)
                except ValueError as e:  # shapes the metadata does not predict: name the file
                    raise ValueError(f"{checkpoint.path}: {e}") from e
            if folder is None or not has_safetensors(folder):
                dense = dense_tensors(mapped, skip)  # the file holds every weight: no folder to read
                offset_stored = mapped.model.architecture in UNIT_OFFSET_STORED
        elif scheme is not None and folder is not None:
            skip, dense = install_checkpoint_quantized(
                model,
                folder,
                scheme,
                keep,
                strict=quantization == scheme.method,
                activations=quant_activations,
            )
        model.to_empty(device=device)
        from_folder = folder is not None and (has_safetensors(folder) or not checkpoint.gguf_files)
        stored = checkpoint_tensors(folder, skip) if folder is not None and from_folder else ()
        tensors = itertools.chain(stored, dense)
        if shard is not None:
            tensors = ((name, shard.rank_part(name, t, whole)) for name, t in tensors)
        _fill_parameters(model, checkpoint.path, tensors)
        model.weights_loaded(offset_stored)
    model.eval().requires_grad_(False)
    return LoadedModel(model, config, checkpoint.eos_token_ids, checkpoint.tokenizer_path)


def has_safetensors(folder: Path) -> bool:
    return (folder / "model.safetensors.index.json").is_file() or any(folder.glob("*.safetensors"))


def _fill_parameters(
    model: LlamaForCausalLM, source: Path, tensors: Iterable[tuple[str, torch.Tensor]]
) -> None:
    """Copy `tensors` (by their Hugging Face names) into the model's dense parameters; every parameter
    the model has must be filled (those already in the model quantized are not among them)."""
    params = dict(model.named_parameters())
    seen: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in tensors:
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
                f"{source}: tensor {name} has shape {tuple(tensor.shape)}, the model's config makes it "
                f"{tuple(dest.shape)}"
            )
        dest.copy_(tensor)  # converts to the model's dtype and device
        seen.update(model.checkpoint_names_filled_by(name))
    if unexpected:
        raise ValueError(
            f"checkpoint {source} has {len(unexpected)} unexpected tensors: {some_names(unexpected)}"
        )
    # A bare-model checkpoint (Qwen3-Embedding's, saved from Qwen3Model) names its tensors without "model.".
    seen |= {n if n.startswith(("model.", "lm_head.")) else f"model.{n}" for n in seen}
    missing = [n for n in model.checkpoint_names() if n not in seen]
    if missing:
        raise ValueError(f"checkpoint {source} lacks {len(missing)} tensors: {some_names(missing)}")
