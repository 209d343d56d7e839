"""Which of a checkpoint's weights a load keeps quantized, and reading them.

A GGUF file's weights stay in their stored types (gguf_weights.py, models/quant_install.py); a GPTQ,
AWQ or compressed-tensors checkpoint's linears are repacked into the same kernel's blocks
(checkpoint_quant.py). Either needs the quantized-linear kernel: the CPU, float32 activations, and a
kernel that builds here. `auto` keeps what it can and says what it could not; an explicit method
refuses with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import structlog
import torch
from safetensors import safe_open

from pagedserve.services.worker.models.llama import LlamaForCausalLM
from pagedserve.services.worker.weights.checkpoint_files import checkpoint_files, some_names
from pagedserve.services.worker.weights.checkpoint_quant import METHODS, IntWeight, Scheme

log = structlog.get_logger("pagedserve.loader")

QUANTIZATIONS = ("auto", "none", "gguf", *METHODS)


def _kernel_unavailable(dtype: str, device: torch.device, what: str = "quantized weights") -> str | None:
    """Why this worker cannot run the quantized-linear kernel, or None where it can."""
    if device.type != "cpu" or dtype != "float32":
        return f"{what} run on the CPU with float32 activations (this worker: {device.type}, {dtype})"
    from pagedserve.kernels.cpu.build import KernelBuildError
    from pagedserve.services.worker.layers.quant_linear import quant_ops

    try:
        quant_ops()
    except KernelBuildError as e:
        return f"the quantized-linear kernel does not build here: {e}"
    return None


def keeps_gguf(gguf_files: tuple[Path, ...], quantization: str, dtype: str, device: torch.device) -> bool:
    """Whether this load keeps the model's GGUF weights in their stored types (see load_model);
    ValueError for an explicit `gguf` this model or worker cannot honour."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {quantization!r}")
    if quantization == "none" or quantization in METHODS:
        return False
    if not gguf_files:
        reason = "the model has no GGUF weights (neither a .gguf file nor a folder holding one)"
    else:
        reason = _kernel_unavailable(dtype, device, "GGUF weights")
    if reason is None:
        return True
    if quantization == "gguf":
        raise ValueError(f"--quantization gguf: {reason}")
    return False


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
    from pagedserve.services.worker.weights.checkpoint_quant import read_linear

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


def install_checkpoint_quantized(
    model: LlamaForCausalLM,
    folder: Path,
    scheme: Scheme,
    keep: bool,
    *,
    strict: bool,
    activations: str | None = None,
) -> tuple[set[str], Iterator[tuple[str, torch.Tensor]]]:
    """Install the linears of a GPTQ/AWQ/compressed-tensors checkpoint that stay quantized (keep);
    -> (the stored tensor names now in the model or dequantized, the dequantized weights of the rest,
    one at a time). strict: every quantized linear must stay so (an explicit --quantization)."""
    from pagedserve.services.worker.weights.checkpoint_quant import kernel_type, to_blocks
    from pagedserve.services.worker.weights.quant_install import install_quantized

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
        installed = install_quantized(model, blocks, keep_bias=True, activations=activations)
        for name in installed:
            del weights[name]
        left = sorted(weights)
        if strict and left:
            raise ValueError(
                f"--quantization {scheme.method}: {len(left)} quantized linears cannot stay quantized "
                "(a fused projection's other part is dense, or its parts read their inputs in different desc_act "
                f"orders, or the model has no such module): {some_names(left)}"
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
def one_thread() -> Iterator[None]:
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
