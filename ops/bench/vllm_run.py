"""The bench side of the vLLM peer: writes the workload for ops/bench/vllm_peer.py, runs it in vLLM's
own venv (ops/peers/setup_vllm.sh) as a separate process, and reads its result back as a PathResult.

A missing venv is reported as that path's error (with the command that creates it), not a crash: the
peer is optional and never part of the default setup.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

from pagedserve.ops.bench.peer_process import run_peer_process
from pagedserve.ops.bench.peers import BenchSettings, PathResult, load_hf_model
from pagedserve.ops.bench.workload import Workload

REPO = Path(__file__).resolve().parents[2]
PEER_SCRIPT = Path(__file__).with_name("vllm_peer.py")
# vLLM's start-up (inductor compile, ~50 s here) plus generation at its slowest seen on 2 shared cores.
TIMEOUT_S = 1800


def vllm_python() -> Path:
    venv = Path(os.environ.get("VLLM_VENV") or REPO / ".venv-vllm")
    return venv / "bin" / "python"


def run_vllm(workload: Workload, settings: BenchSettings, threads: int) -> PathResult:
    python = vllm_python()
    if not python.exists():
        return PathResult(
            "vllm",
            error=f"no vLLM venv at {python.parent.parent}: run ops/peers/setup_vllm.sh (about 3.4 GB)",
        )
    if settings.model_path.suffix != ".gguf":
        return _run(python, workload, settings, threads, settings.model_path)
    # vLLM's CPU build runs no GGUF quantized types: it gets the same weights as our dequantized
    # path, written as a float32 folder (start-up, not timed; the folder goes with the run).
    with tempfile.TemporaryDirectory(prefix="pagedserve-vllm-model-") as folder:
        _write_float_folder(load_hf_model(dataclasses.replace(settings, dtype="float32")), Path(folder))
        return _run(python, workload, settings, threads, Path(folder))


def _write_float_folder(model: Any, folder: Path) -> None:
    """config.json and model.safetensors of a model transformers read from a GGUF (it refuses to
    save_pretrained those: the weights are plain tensors by now, so they are written directly)."""
    from safetensors.torch import save_model

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"))  # tied LM head: written once


def _run(python: Path, workload: Workload, settings: BenchSettings, threads: int, model: Path) -> PathResult:
    request = {
        "model_path": str(model),
        "dtype": settings.dtype,
        "threads": threads,
        "seed": settings.seed,
        "temperature": settings.temperature,
        "prompts": workload.prompts,
        "output_lens": workload.output_lens,
        "max_num_seqs": settings.max_num_seqs,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        # Its pool in GiB, at least the bytes ours gets (vLLM takes whole GiB).
        "kv_cache_space_gib": max(1, -(-settings.kv_cache_memory // 1024**3)),
        "enforce_eager": os.environ.get("PAGEDSERVE_BENCH_VLLM_EAGER") == "1",
        # `--emulate-isa`: the environment is inherited; vLLM must also load its AVX2 build.
        "emulate_isa": os.environ.get("PAGEDSERVE_CPU_ISA") or None,
    }
    return run_peer_process("vllm", python, PEER_SCRIPT, request, TIMEOUT_S)
