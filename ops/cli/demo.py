"""`pagedserve demo`: the whole path in one command on the bundled model.

Start a local deployment (1 worker), wait until it is ready, ask one chat-formatted question,
print the answer, stop everything. Service logs go to a temporary folder and are shown only
when something fails, so the terminal holds just the answer.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TextIO

from pagedserve.ops.cli.generate import generate_text
from pagedserve.ops.deploy.supervisor import Supervisor, resolve_model_first
from pagedserve.shared.config import ServeConfig

DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence."


def chat_prompt(model: str, question: str, tokenizer_folder: str | None = None) -> str:
    """The question wrapped in the model's chat template, as the scheduler takes plain text."""
    from pagedserve.services.checkpoint import load_checkpoint, load_tokenizer

    tokenizer = load_tokenizer(load_checkpoint(model, tokenizer_folder).tokenizer_path)
    if tokenizer is None:
        return question  # no tokenizer: the scheduler will refuse text anyway, and say so
    if not getattr(tokenizer, "chat_template", None):
        return question  # a base model: no template, the question is the prompt
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def run_demo(
    config: ServeConfig,
    question: str = DEFAULT_PROMPT,
    max_tokens: int = 96,
    ready_timeout_s: float = 300.0,
    stream: bool = True,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    err.write(f"demo: preparing model {config.model!r}\n")
    try:
        config = resolve_model_first(config)
    except ValueError as e:  # no such checkpoint folder
        err.write(f"demo: {e}\n")
        return 2
    prompt = chat_prompt(config.model, question, config.tokenizer)
    with tempfile.TemporaryDirectory(prefix="pagedserve-demo-") as logs:
        # No restarts of the core services: a demo that cannot start should say so at once.
        supervisor = Supervisor(config, workers=1, log_dir=Path(logs), restart_core=False)
        try:
            supervisor.start()
            err.write(
                f"demo: starting the deployment (front {supervisor.front_endpoint}), waiting until ready\n"
            )
            supervisor.wait_ready(timeout_s=ready_timeout_s)
            err.write(f"demo: Q: {question}\n")
            answer = generate_text(
                config.front_endpoint,
                prompt,
                out,
                stream=stream,
                keys_dir=config.curve_keys_dir,
                max_tokens=max_tokens,
                temperature=0.0,
            )
            if not answer.strip():
                err.write("demo: the model answered with no text\n")
                return 1
            return 0
        except Exception as e:  # noqa: BLE001 - the CLI boundary: report, show logs, exit non-zero
            err.write(f"demo: failed: {e}\n")
            write_log_tails(Path(logs), err)
            return 1
        finally:
            supervisor.stop()


def write_log_tails(log_dir: Path, err: TextIO, lines: int = 25) -> None:
    for path in sorted(log_dir.glob("*.log")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        if tail:
            err.write(f"--- {path.name} (last {len(tail)} lines)\n" + "\n".join(tail) + "\n")
