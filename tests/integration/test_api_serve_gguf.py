"""`pagedserve serve FILE.gguf`: a GGUF file alone is a model. The deployment serves it through the
OpenAI API under the file's name, chats with the template from the file's metadata, and answers
greedy requests with the text the same model's checkpoint folder gives (both dense: the folder holds
the GGUF's dequantized weights, tests/harness/gguf_models.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from harness.deployment import free_ports
from harness.gguf_models import write_gguf
from harness.tiny_models import make_tiny_model

from pagedserve import LLM, SamplingParams

MESSAGES = [{"role": "user", "content": "Say something."}]
MAX_TOKENS = 16


# Llama (q/k rows reordered by llama.cpp's layout, tied head) as Q8_0; Qwen3 (q/k norms, a head_dim
# that is not hidden/heads, one KV head) as F16. Mistral and Qwen2 are checked in-process, as files
# written by llama.cpp's own converter (tests/unit/worker/test_gguf_llamacpp_converted.py).
@pytest.mark.parametrize(("arch", "kind"), [("llama", "Q8_0"), ("qwen3", "F16")])
def test_serve_a_gguf_file_chats_with_its_own_template_as_the_folder_does(
    tmp_path: Path, arch: str, kind: str
) -> None:
    folder = make_tiny_model(arch, tmp_path / "tiny")
    gguf = write_gguf(folder, tmp_path / f"tiny-{arch}.gguf", kind)
    folder_llm = LLM(str(folder), num_blocks=64, quantization="none")
    chat = folder_llm.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    expected_chat, expected_text = (o.text for o in folder_llm.generate([chat, "Once upon"], greedy))

    front, workers, bm, sched_ops, bm_ops, api_port = free_ports(6)
    argv = [
        sys.executable, "-m", "pagedserve.ops.cli", "serve", str(gguf), "--quantization", "none",
        "--front-endpoint", f"tcp://127.0.0.1:{front}",
        "--worker-endpoint", f"tcp://127.0.0.1:{workers}",
        "--block-manager-endpoint", f"tcp://127.0.0.1:{bm}",
        "--scheduler-ops-port", str(sched_ops), "--block-manager-ops-port", str(bm_ops),
        "--api-port", str(api_port), "--num-blocks", "128", "--num-threads", "1",
        "--log-dir", str(tmp_path / "logs"), "--ready-timeout", "180",
    ]  # fmt: skip
    # The usual cache: the kernels are built there (a fresh one would compile them for minutes).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEDSERVE_") or k == "PAGEDSERVE_CACHE"}
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert up.stdout is not None
        lines: list[str] = []
        while not (lines and lines[-1].startswith("ready in")):
            lines.append(up.stdout.readline())
            assert lines[-1], f"serve exited before it was ready: {''.join(lines)}"
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{api_port}/v1", api_key="unused", max_retries=0)
        (model,) = client.models.list().data
        assert model.id == f"tiny-{arch}"  # the file's name without .gguf

        reply = client.chat.completions.create(
            model=f"tiny-{arch}", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0
        )
        assert reply.choices[0].message.content == expected_chat
        # the template came from the file: the prompt is the folder's rendering of it, token for token
        assert reply.usage.prompt_tokens == len(folder_llm.encode(chat))
        text = client.completions.create(
            model=f"tiny-{arch}", prompt="Once upon", max_tokens=MAX_TOKENS, temperature=0
        )
        assert text.choices[0].text == expected_text

        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=30)
        assert up.returncode == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
