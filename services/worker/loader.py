"""Load a Hugging Face checkpoint folder (config.json + *.safetensors) into our model modules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from pagedserve.kernels.attention import AttentionBackend
from pagedserve.kernels.cpu.isa import forced_isa
from pagedserve.services.checkpoint import read_checkpoint
from pagedserve.services.worker.models.llama import LlamaForCausalLM
from pagedserve.services.worker.models.registry import ModelConfig, resolve
from safetensors import safe_open

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


QUANTIZATIONS = ("auto", "none", "gguf")


def load_model(
    path: str | Path,
    backend: AttentionBackend,
    *,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    quantization: str = "none",
) -> LoadedModel:
    """quantization: `none` loads every weight dense in `dtype` (a GGUF's dequantized copy); `gguf` keeps
    the folder's GGUF weights in their stored types (ValueError where it cannot); `auto` does so where
    the folder has a GGUF and this worker can run it (CPU, float32, the kernel builds), else `none`."""
    folder = Path(path)
    checkpoint = read_checkpoint(folder)
    model_class, config = resolve(checkpoint.config)
    gguf_file = quantized_source(folder, quantization, dtype, torch.device(device))
    # Built on the meta device: no memory and no random init for weights about to be overwritten.
    with torch.device("meta"):
        model = model_class(config, backend).to(dtype=torch_dtype(dtype))
    skip: set[str] = set()
    if gguf_file is not None:
        from pagedserve.services.worker.gguf_weights import read_gguf
        from pagedserve.services.worker.models.quant_install import install_quantized

        skip = install_quantized(model, read_gguf(gguf_file))
    model.to_empty(device=torch.device(device))
    _fill_parameters(model, folder, skip)
    model.eval().requires_grad_(False)
    return LoadedModel(model, config, checkpoint.eos_token_ids)


def quantized_source(folder: Path, quantization: str, dtype: str, device: torch.device) -> Path | None:
    """The GGUF whose stored types this load keeps, or None for a dense load (see load_model)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {quantization!r}")
    if quantization == "none":
        return None
    from pagedserve.kernels.cpu.build import KernelBuildError
    from pagedserve.services.worker.gguf_weights import gguf_source
    from pagedserve.services.worker.models.quant_linear import quant_ops

    source = gguf_source(folder)
    reason = None
    if source is None:
        reason = f"{folder} has no GGUF weights (no *.gguf, no pagedserve_source.json naming one)"
    elif device.type != "cpu" or dtype != "float32":
        reason = f"GGUF weights run on the CPU with float32 activations (this worker: {device.type}, {dtype})"
    else:
        try:
            quant_ops()
        except KernelBuildError as e:
            reason = f"the quantized-linear kernel does not build here: {e}"
    if reason is None:
        return source
    if quantization == "gguf":
        raise ValueError(f"--quantization gguf: {reason}")
    return None


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


def _fill_parameters(model: LlamaForCausalLM, folder: Path, skip: set[str] | None = None) -> None:
    """skip: checkpoint tensors already in the model in another form (quantized weights)."""
    params = dict(model.named_parameters())
    seen: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in checkpoint_tensors(folder, skip or set()):
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
        seen.add(name)
    if unexpected:
        raise ValueError(
            f"checkpoint in {folder} has {len(unexpected)} unexpected tensors: {_some(unexpected)}"
        )
    missing = [n for n in model.checkpoint_names() if n not in seen]
    if missing:
        raise ValueError(f"checkpoint in {folder} lacks {len(missing)} tensors: {_some(missing)}")


def _some(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (f" (and {len(names) - limit} more)" if len(names) > limit else "")
