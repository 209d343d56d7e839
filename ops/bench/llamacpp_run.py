"""The bench side of the llama.cpp peer: finds the checkpoint's GGUF, writes the workload for
ops/bench/llamacpp_peer.py, runs it in llama.cpp's own venv (ops/peers/setup_llamacpp.sh) as a separate
process and reads its result back. A missing venv or GGUF is that path's error, not a crash."""

from __future__ import annotations

import os
from pathlib import Path

from pagedserve.ops.bench.peer_process import run_peer_process
from pagedserve.ops.bench.peers import BenchSettings, PathResult
from pagedserve.ops.bench.workload import Workload

REPO = Path(__file__).resolve().parents[2]
PEER_SCRIPT = Path(__file__).with_name("llamacpp_peer.py")
TIMEOUT_S = 1800


def llamacpp_python() -> Path:
    venv = Path(os.environ.get("LLAMACPP_VENV") or REPO / ".venv-llamacpp")
    return venv / "bin" / "python"


def run_llamacpp(workload: Workload, settings: BenchSettings, threads: int) -> PathResult:
    from pagedserve.services.worker.gguf_weights import gguf_source

    python = llamacpp_python()
    if not (python.parent.parent / ".llamacpp-installed").exists():  # written once its build succeeded
        return PathResult(
            "llamacpp",
            error=f"no finished llama.cpp venv at {python.parent.parent}: run ops/peers/setup_llamacpp.sh",
        )
    gguf = gguf_source(settings.model_path)
    if gguf is None:
        return PathResult("llamacpp", error=f"{settings.model_path} has no GGUF file for llama.cpp to read")
    request = {
        "gguf_path": str(gguf),
        "threads": threads,
        "seed": settings.seed,
        "temperature": settings.temperature,
        "prompts": workload.prompts,
        "output_lens": workload.output_lens,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
    }
    return run_peer_process("llamacpp", python, PEER_SCRIPT, request, TIMEOUT_S)
