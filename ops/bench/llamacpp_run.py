"""The bench side of the llama.cpp peer: finds the checkpoint's GGUF, writes the workload for
ops/bench/llamacpp_peer.py, runs it in llama.cpp's own venv (ops/peers/setup_llamacpp.sh) as a separate
process and reads its result back. A missing venv or GGUF is that path's error, not a crash."""

from __future__ import annotations

from pathlib import Path

from pagedserve.ops.bench.llamacpp_server import llamacpp_venv, llamacpp_venv_ready
from pagedserve.ops.bench.peer_process import run_peer_process
from pagedserve.ops.bench.peers import BenchSettings, PathResult
from pagedserve.ops.bench.workload import Workload

PEER_SCRIPT = Path(__file__).with_name("llamacpp_peer.py")
TIMEOUT_S = 1800


def run_llamacpp(workload: Workload, settings: BenchSettings, threads: int) -> PathResult:
    from pagedserve.services.worker.weights.gguf_weights import gguf_source

    venv = llamacpp_venv()
    if not llamacpp_venv_ready(venv):
        return PathResult(
            "llamacpp", error=f"no finished llama.cpp venv at {venv}: run ops/peers/setup_llamacpp.sh"
        )
    python = venv / "bin" / "python"
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
