"""llama.cpp's servers from the llama.cpp venv as `bench serve`'s peer, for real, on the bundled GGUF:
- llama_cpp.server answers the load's text prompts with outputs that run to max_tokens (EOS biased
  away), and serves one request at a time (0.3.36 has no parallel slots: a global lock);
- llama-server takes the token-id prompts and ignore_eos as pagedserve does, and serves its slots at
  once.
Each skips, saying so, where the venv (or its llama-server) is absent."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from pagedserve.ops.bench.llamacpp_server import (
    llama_server_argv,
    llama_server_binary,
    llamacpp_venv,
    llamacpp_venv_ready,
    request_extras,
    running_server,
    server_argv,
)
from pagedserve.ops.bench.serve_load import LoadSpec, run_load
from pagedserve.services.checkpoint import read_checkpoint, resolve_model
from pagedserve.services.worker.weights.gguf_weights import gguf_source

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,"]


def test_llamacpp_server_runs_the_load_one_request_at_a_time(tmp_path: Path) -> None:
    venv = llamacpp_venv()
    if not llamacpp_venv_ready(venv):
        pytest.skip(f"no finished llama.cpp venv at {venv} (run ops/peers/setup_llamacpp.sh)")
    folder = Path(resolve_model("smollm2-135m"))
    argv = server_argv(venv / "bin" / "python", gguf_source(folder), 8013, 2, 2048)
    base_url = "http://127.0.0.1:8013/v1"
    with running_server(argv, base_url, tmp_path / "server.log"):
        spec = LoadSpec(
            base_url, "m", [[0] * 5] * len(PROMPTS), [24] * len(PROMPTS), math.inf,
            prompt_texts=PROMPTS, extra_body=request_extras(list(read_checkpoint(folder).eos_token_ids)),
        )  # fmt: skip
        records, _ = asyncio.run(run_load(spec))
    assert all(r.ok for r in records), [r.error for r in records]
    assert all(r.output_tokens >= 20 for r in records), [r.output_tokens for r in records]
    first, *_, last = sorted(records, key=lambda r: r.ttft_s)
    assert last.ttft_s >= 0.9 * first.e2e_s, (
        "the last request's first token came before the first had finished"
    )


def test_llama_server_serves_token_prompts_to_max_tokens_in_parallel_slots(tmp_path: Path) -> None:
    venv = llamacpp_venv()
    binary = llama_server_binary(venv) if llamacpp_venv_ready(venv) else None
    if binary is None:
        pytest.skip(f"no llama-server in the llama.cpp venv at {venv} (run ops/peers/setup_llamacpp.sh)")
    folder = Path(resolve_model("smollm2-135m"))
    argv = llama_server_argv(binary, gguf_source(folder), 8014, 2, 256, 3)
    base_url = "http://127.0.0.1:8014/v1"
    prompts = [[1, 504, 3458, 282, 4649, 314], [1, 563, 28, 9, 30, 44], [1, 10077, 2065, 253, 655, 28]]
    with running_server(argv, base_url, tmp_path / "server.log"):
        spec = LoadSpec(base_url, "m", prompts, [48] * len(prompts), math.inf)
        records, _ = asyncio.run(run_load(spec))
    assert all(r.ok for r in records), [r.error for r in records]
    # ignore_eos honoured and counted by the stream's usage: every output is exactly max_tokens.
    assert [r.output_tokens for r in records] == [48] * len(prompts)
    first, *_, last = sorted(records, key=lambda r: r.ttft_s)
    assert last.ttft_s < 0.5 * first.e2e_s, "the slots did not serve the requests at once"
