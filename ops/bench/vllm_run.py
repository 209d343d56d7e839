"""The bench side of the vLLM peer: writes the workload for ops/bench/vllm_peer.py, runs it in vLLM's
own venv (ops/peers/setup_vllm.sh) as a separate process, and reads its result back as a PathResult.

A missing venv is reported as that path's error (with the command that creates it), not a crash: the
peer is optional and never part of the default setup.
"""

from __future__ import annotations

import os
from pathlib import Path

from pagedserve.ops.bench.peer_process import run_peer_process
from pagedserve.ops.bench.peers import BenchSettings, PathResult
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
    request = {
        "model_path": str(settings.model_path),
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
