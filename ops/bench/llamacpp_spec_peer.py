"""llama.cpp's prompt lookup as a peer of `pagedserve bench speculative`: one user, greedy, the bench's own
prompt tokens one after another, without and with llama-cpp-python's LlamaPromptLookupDecoding draft.

    .venv-llamacpp/bin/python ops/bench/llamacpp_spec_peer.py REQUEST.json RESULT.json

Runs in llama.cpp's venv (ops/peers/setup_llamacpp.sh), importing nothing from pagedserve. Request:
{"gguf_path", "threads", "prompts" (token id lists), "max_tokens"}. Result: the peer shape ({"name",
"output_tokens", "wall_s", "tokens_per_s", "error"}, the no-draft run) plus "lookup" and "baseline"
({"output_tokens", "wall_s", "tokens_per_s"}) and "speedup". Model load and a warm-up are not timed;
each prompt is fed whole (llama-cpp-python's prefix reuse between prompts is reset before each).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any


def one_mode(request: dict[str, Any], lookup: bool) -> dict[str, Any]:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(max_ngram_size=4, num_pred_tokens=6) if lookup else None
    llm = Llama(
        request["gguf_path"],
        n_ctx=4096,
        n_threads=int(request["threads"]),
        n_threads_batch=int(request["threads"]),
        draft_model=draft,
        verbose=False,
    )
    llm.create_completion(request["prompts"][0], max_tokens=4, temperature=0.0)  # warm-up
    tokens = 0
    wall = 0.0
    outputs = []
    for prompt in request["prompts"]:
        llm.reset()
        started = time.perf_counter()
        out = llm.create_completion(prompt, max_tokens=int(request["max_tokens"]), temperature=0.0)
        wall += time.perf_counter() - started
        tokens += out["usage"]["completion_tokens"]
        outputs.append(out["choices"][0]["text"])
    return {"output_tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2)}


def main() -> int:
    with open(sys.argv[1]) as f:
        request = json.load(f)
    result: dict[str, Any] = {"name": "llamacpp-lookup", "output_tokens": 0, "wall_s": 0.0, "error": None}
    try:
        base = one_mode(request, lookup=False)
        lookup = one_mode(request, lookup=True)
        result.update(base)
        result.update(
            baseline=base, lookup=lookup, speedup=round(lookup["tokens_per_s"] / base["tokens_per_s"], 3)
        )
    except Exception as e:  # reported as this path's error
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
