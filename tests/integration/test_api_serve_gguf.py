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
from harness.deployment import free_ports
from harness.gguf_models import write_gguf
from harness.tiny_models import make_tiny_model

from pagedserve import LLM, SamplingParams

MESSAGES = [{"role": "user", "content": "Say something."}]
MAX_TOKENS = 16


def test_serve_a_gguf_file_chats_with_its_own_template_as_the_folder_does(tmp_path: Path) -> None:
    folder = make_tiny_model("llama", tmp_path / "tiny")
    gguf = write_gguf(folder, tmp_path / "tiny-q8.gguf", "Q8_0")
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
        assert model.id == "tiny-q8"  # the file's name without .gguf

        reply = client.chat.completions.create(
            model="tiny-q8", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0
        )
        assert reply.choices[0].message.content == expected_chat
        # the template came from the file: the prompt is the folder's rendering of it, token for token
        assert reply.usage.prompt_tokens == len(folder_llm.encode(chat))
        text = client.completions.create(
            model="tiny-q8", prompt="Once upon", max_tokens=MAX_TOKENS, temperature=0
        )
        assert text.choices[0].text == expected_text

        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=30)
        assert up.returncode == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
