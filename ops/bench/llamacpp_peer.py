"""llama.cpp as a peer of `pagedserve bench`: the bench's workload through llama-cpp-python's low-level
batched API, every request at once, one sequence id (and KV stream) per request.

    .venv-llamacpp/bin/python ops/bench/llamacpp_peer.py REQUEST.json RESULT.json

Runs in its own venv (ops/peers/setup_llamacpp.sh) as a process of its own, importing nothing from
pagedserve. The request JSON: {"gguf_path", "threads", "seed", "temperature", "prompts", "output_lens",
"max_num_batched_tokens"}; the result has every path's shape ({"name", "output_tokens", "wall_s",
"tokens_per_s", "error", ...details}, the GGUF's type among the details).

How it drives llama.cpp: one context with n_seq_max = the number of requests and a KV stream per
sequence (kv_unified off: with one shared buffer every sequence's attention spans every cell), a
`llama_batch` of up to max_num_batched_tokens tokens, each token tagged with its request's sequence
id. Prompts are fed first, in chunks, asking logits only of each prompt's last token; then every
step decodes one token of every unfinished request in one batch. Sampling is llama.cpp's own chain
(temperature, then a seeded draw; greedy at temperature 0). Timed like our path: model load, context
creation and a warm-up decode are not counted; only the prefill and decode of the workload are.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def run(request: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp as lc

    prompts: list[list[int]] = request["prompts"]
    output_lens: list[int] = request["output_lens"]
    threads = int(request["threads"])
    n_seq = len(prompts)
    per_seq = max(len(p) + n for p, n in zip(prompts, output_lens, strict=True))
    n_batch = max(int(request["max_num_batched_tokens"]), n_seq)

    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    model = lc.llama_model_load_from_file(request["gguf_path"].encode(), mparams)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {request['gguf_path']}")
    cparams = lc.llama_context_default_params()
    cparams.n_seq_max = n_seq
    cparams.n_ctx = n_seq * (-(-per_seq // 256) * 256)
    cparams.n_batch = n_batch
    cparams.n_ubatch = n_batch
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    if hasattr(cparams, "kv_unified"):
        cparams.kv_unified = False
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    sampler = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    temperature = float(request["temperature"])
    if temperature > 0:
        lc.llama_sampler_chain_add(sampler, lc.llama_sampler_init_temp(temperature))
        lc.llama_sampler_chain_add(sampler, lc.llama_sampler_init_dist(int(request["seed"])))
    else:
        lc.llama_sampler_chain_add(sampler, lc.llama_sampler_init_greedy())
    batch = lc.llama_batch_init(n_batch, 0, 1)

    def decode(entries: list[tuple[int, int, int, bool]]) -> None:
        """entries: (token, position, sequence id, wants logits)."""
        batch.n_tokens = len(entries)
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logits
        status = lc.llama_decode(ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status} for a batch of {len(entries)} tokens")

    memory = lc.llama_get_memory(ctx)
    decode([(1, 0, 0, True), (2, 1, 0, True)])  # warm-up, then forgotten
    lc.llama_memory_clear(memory, True)

    generated = [0] * n_seq
    last = [0] * n_seq
    t0 = time.perf_counter()
    # Prefill: every prompt's tokens, in batches of n_batch; each prompt's last token samples.
    pending = [
        (tok, pos, seq, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, tok in enumerate(p)
    ]
    for start in range(0, len(pending), n_batch):
        chunk = pending[start : start + n_batch]
        decode(chunk)
        for i, (_, _, seq, wants) in enumerate(chunk):
            if wants:
                last[seq] = lc.llama_sampler_sample(sampler, ctx, i)
                generated[seq] = 1
    steps = 0
    while True:
        active = [s for s in range(n_seq) if generated[s] < output_lens[s]]
        if not active:
            break
        decode([(last[s], len(prompts[s]) + generated[s] - 1, s, True) for s in active])
        steps += 1
        for i, s in enumerate(active):
            last[s] = lc.llama_sampler_sample(sampler, ctx, i)
            generated[s] += 1
    wall = time.perf_counter() - t0
    description = ctypes.create_string_buffer(256)
    lc.llama_model_desc(model, description, 256)
    lc.llama_batch_free(batch)
    lc.llama_sampler_free(sampler)
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return {
        "name": "llamacpp",
        "output_tokens": sum(generated),
        "wall_s": wall,
        "tokens_per_s": sum(generated) / wall if wall else 0.0,
        "error": None,
        "decode_steps": steps,
        "gguf": Path(request["gguf_path"]).name,
        "model_desc": description.value.decode(errors="replace"),
        "llama_cpp_python": lc.__version__,
        "system_info": lc.llama_print_system_info().decode(errors="replace"),
        "kv_unified": False,
        "n_ctx": cparams.n_ctx,
    }


def main() -> None:
    request_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    request = json.loads(request_path.read_text())
    try:
        result = run(request)
    except Exception as e:
        traceback.print_exc()
        result = {
            "name": "llamacpp",
            "output_tokens": 0,
            "wall_s": 0.0,
            "tokens_per_s": 0.0,
            "error": f"{type(e).__name__}: {e}",
        }
    result_path.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
