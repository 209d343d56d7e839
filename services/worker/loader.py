"""Load a Hugging Face checkpoint folder (config.json + *.safetensors) into our model modules."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch
from pagedserve.kernels.attention import AttentionBackend
from pagedserve.kernels.cpu.isa import forced_isa
from pagedserve.services.checkpoint import read_checkpoint
from pagedserve.services.worker.checkpoint_quant import METHODS, IntWeight, Scheme, parse_scheme
from pagedserve.services.worker.models.llama import LlamaForCausalLM
from pagedserve.services.worker.models.registry import ModelConfig, resolve
from safetensors import safe_open

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


# vLLM's names for the checkpoint formats (services/worker/checkpoint_quant.py) after ours.
QUANTIZATIONS = ("auto", "none", "gguf", *METHODS)


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
    # A checkpoint format's repack and dequantization run on one thread (see _one_thread); the dense
    # rest is dequantized one weight at a time as _fill_parameters reads it.
    with _one_thread() if gguf_file is None and scheme is not None else nullcontext():
        if gguf_file is not None:
            from pagedserve.services.worker.gguf_weights import read_gguf
            from pagedserve.services.worker.models.quant_install import install_quantized

            skip = install_quantized(model, read_gguf(gguf_file))
        elif scheme is not None:
            skip, dense = _checkpoint_quantized(
                model, folder, scheme, keep, strict=quantization == scheme.method
            )
        model.to_empty(device=device)
        _fill_parameters(model, folder, skip, dense)
    model.eval().requires_grad_(False)
    return LoadedModel(model, config, checkpoint.eos_token_ids)


def _kernel_unavailable(dtype: str, device: torch.device, what: str = "quantized weights") -> str | None:
    """Why this worker cannot run the quantized-linear kernel, or None where it can."""
    if device.type != "cpu" or dtype != "float32":
        return f"{what} run on the CPU with float32 activations (this worker: {device.type}, {dtype})"
    from pagedserve.kernels.cpu.build import KernelBuildError
    from pagedserve.services.worker.models.quant_linear import quant_ops

    try:
        quant_ops()
    except KernelBuildError as e:
        return f"the quantized-linear kernel does not build here: {e}"
    return None


def quantized_source(folder: Path, quantization: str, dtype: str, device: torch.device) -> Path | None:
    """The GGUF whose stored types this load keeps, or None (a dense load or a checkpoint format's; see
    load_model)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {quantization!r}")
    if quantization == "none" or quantization in METHODS:
        return None
    from pagedserve.services.worker.gguf_weights import gguf_source

    source = gguf_source(folder)
    reason = None
    if source is None:
        reason = f"{folder} has no GGUF weights (no *.gguf, no pagedserve_source.json naming one)"
    else:
        reason = _kernel_unavailable(dtype, device, "GGUF weights")
    if reason is None:
        return source
    if quantization == "gguf":
        raise ValueError(f"--quantization gguf: {reason}")
    return None


# Older exports keep the quantization config beside config.json: AutoGPTQ's file, AutoAWQ's.
_QUANT_CONFIG_FILES = {"quantize_config.json": "gptq", "quant_config.json": "awq"}


def quantization_config(folder: Path, config: dict) -> dict | None:
    """config.json's quantization_config, else that of an older export's file beside it (its
    quant_method, where the file has none, is the tool's that writes that file)."""
    if config.get("quantization_config") is not None:
        return config["quantization_config"]
    for name, method in _QUANT_CONFIG_FILES.items():
        file = folder / name
        if file.is_file():
            return {"quant_method": method, **json.loads(file.read_text())}
    return None


def keeps_checkpoint_quantized(
    config: dict, scheme: Scheme | None, quantization: str, dtype: str, device: torch.device
) -> bool:
    """Whether this load keeps a GPTQ/AWQ/compressed-tensors checkpoint's linears quantized (see
    load_model); ValueError for an explicit format the folder is not in or this worker cannot run."""
    if quantization in METHODS:
        if scheme is None or scheme.method != quantization:
            qc = config.get("quantization_config")
            method = qc.get("quant_method") if isinstance(qc, dict) else None
            found = (
                "no quantization_config (nor a quantize_config.json or quant_config.json beside it)"
                if method is None
                else f"quantization_config.quant_method {method!r}"
            )
            raise ValueError(f"--quantization {quantization}: the checkpoint's config.json has {found}")
        reason = _kernel_unavailable(dtype, device)
        if reason is not None:
            raise ValueError(f"--quantization {quantization}: {reason}")
        return True
    return scheme is not None and quantization == "auto" and _kernel_unavailable(dtype, device) is None


def read_quantized_linears(folder: Path, scheme: Scheme) -> tuple[dict[str, IntWeight], set[str]]:
    """The checkpoint's quantized linears -> ({`<module>.weight`: its IntWeight}, the stored tensor names
    they are made of). A linear's tensors may lie in different shards."""
    from pagedserve.services.worker.checkpoint_quant import read_linear

    files = checkpoint_files(folder)
    keys: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            keys.update(dict.fromkeys(f.keys(), file))  # noqa: SIM118 - safe_open is not a mapping
    modules = {k.rpartition(".")[0] for k in keys if k.rpartition(".")[2] == scheme.marker}
    names = {k for k in keys if k.rpartition(".")[0] in modules and k.rpartition(".")[2] in scheme.suffixes}
    parts: dict[str, dict[str, torch.Tensor]] = {m: {} for m in modules}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in sorted(n for n in names if keys[n] == file):
                module, _, suffix = name.rpartition(".")
                parts[module][suffix] = f.get_tensor(name)
    weights = {f"{m}.weight": read_linear(scheme, parts[m], m) for m in sorted(modules)}
    return weights, names


def _zero_biases(model: LlamaForCausalLM, folder: Path, modules: set[str]) -> set[str]:
    """Bias tensors of quantized linears the model has no bias for, all zeros (GPTQ checkpoints may
    carry them; vLLM skips GPTQ's extra biases whatever their values); a nonzero one is left for the
    loader to refuse as unexpected."""
    params = {name for name, _ in model.named_parameters()}
    found: set[str] = set()
    for file in checkpoint_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                module, _, suffix = name.rpartition(".")
                if suffix != "bias" or module not in modules:
                    continue
                target = model.checkpoint_target(name)
                if target is not None and target[0] not in params and not f.get_tensor(name).any():
                    found.add(name)
    return found


def _checkpoint_quantized(
    model: LlamaForCausalLM, folder: Path, scheme: Scheme, keep: bool, *, strict: bool
) -> tuple[set[str], Iterator[tuple[str, torch.Tensor]]]:
    """Install the linears of a GPTQ/AWQ/compressed-tensors checkpoint that stay quantized (keep);
    -> (the stored tensor names now in the model or dequantized, the dequantized weights of the rest,
    one at a time). strict: every quantized linear must stay so (an explicit --quantization)."""
    from pagedserve.services.worker.checkpoint_quant import kernel_type, to_blocks
    from pagedserve.services.worker.models.quant_install import install_quantized

    weights, stored = read_quantized_linears(folder, scheme)
    stored |= _zero_biases(model, folder, {name.removesuffix(".weight") for name in weights})
    installed: set[str] = set()
    if keep:
        types, reasons = {}, {}
        for name, w in weights.items():
            types[name], reasons[name] = kernel_type(w)
        if strict and any(t is None for t in types.values()):
            name = next(n for n, t in types.items() if t is None)
            count = sum(t is None for t in types.values())
            raise ValueError(
                f"--quantization {scheme.method}: {name} ({count} linears in all): {reasons[name]}"
            )
        # The parts of a fused projection (q/k/v, gate/up) share a type: Q4_0 beside Q4_1 becomes Q4_1
        # (exact: m = -8 d).
        fused: dict[str, set[str]] = {}
        for name, t in types.items():
            fused.setdefault(_fused_key(model, name), set()).add(t)
        for name, t in types.items():
            if t == "Q4_0" and "Q4_1" in fused[_fused_key(model, name)]:
                types[name] = "Q4_1"
        blocks = {n: to_blocks(weights[n], t, scheme.method) for n, t in types.items() if t is not None}
        installed = install_quantized(model, blocks, keep_bias=True)
        for name in installed:
            del weights[name]
        left = sorted(weights)
        if strict and left:
            raise ValueError(
                f"--quantization {scheme.method}: {len(left)} quantized linears cannot stay quantized "
                "(a fused projection's other part is dense, or its parts read their inputs in different desc_act "
                f"orders, or the model has no such module): {_some(left)}"
            )
        if left:
            fused_reason = (
                "a fused projection's parts: one has no kernel format or their desc_act orders differ"
            )
            why = sorted({reasons[n] or fused_reason for n in left})
            log.info(
                "quantized linears dequantized to dense", method=scheme.method, count=len(left), reasons=why
            )

    def dense() -> Iterator[tuple[str, torch.Tensor]]:
        for name in sorted(weights):
            yield name, weights.pop(name).dequantize()

    return stored, dense()


@contextmanager
def _one_thread() -> Iterator[None]:
    """torch ops on one thread for the repack: its byte shuffles are memory bound, and with 2 threads
    on 2 busy shared cores each op's parallel region waited on a descheduled thread: a
    SmolLM2-135M-shaped GPTQ load took 12.4 s on 2 threads against 0.9 s on 1 (load average ~4)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _fused_key(model: LlamaForCausalLM, name: str) -> str:
    """`...self_attn.q_proj.weight` -> `...self_attn.qkv_proj`: the module a checkpoint weight ends up in."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in model.fused_projections:
        parts[-2] = model.fused_projections[parts[-2]][0]
    return ".".join(parts[:-1])


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
