"""llama.cpp's OpenAI-compatible server as a peer of `pagedserve bench serve`: started from its own venv
on the same GGUF with the same threads, loaded with the same requests, stopped after.

Two servers can play the peer; the first one the venv has is used:
- `llama-server`, llama.cpp's own (ops/peers/setup_llamacpp.sh builds it from the same sdist): slots
  (`--parallel N`, one KV stream each, `--no-kv-unified`) and continuous batching, so it serves N
  requests at once as llama.cpp users deploy it. It takes token-id prompts and `ignore_eos`, and
  its stream carries usage: the load runs exactly as against pagedserve.
- `python -m llama_cpp.server` (llama-cpp-python 0.3.36), a fallback read from its source
  (llama_cpp/server/app.py, settings.py, types.py):
  - No parallel slots: settings have no n_parallel, and every completion takes the global
    `llama_outer_lock` / `llama_inner_lock` pair, so requests run one at a time, queued in arrival
    order.
  - `interrupt_requests` defaults to True: a waiting request cuts the streaming one short. It is
    turned off here, or every run at rate > 1 would measure cut-off streams.
  - Prompts are text only (`prompt: str | list[str]`), so the token-id prompts go as their decoded
    text; there is no `ignore_eos`, so EOS gets a logit bias of -100 instead (every output runs to
    max_tokens); the stream carries no usage, so output tokens are counted as content chunks.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pagedserve.ops.deploy.ops_client import wait_ok
from pagedserve.ops.results import portable_text

REPO = Path(__file__).resolve().parents[2]


def llamacpp_venv() -> Path:
    """LLAMACPP_VENV, else .venv-llamacpp at the repo root (ops/peers/setup_llamacpp.sh's default)."""
    return Path(os.environ.get("LLAMACPP_VENV") or REPO / ".venv-llamacpp")


def llamacpp_venv_ready(venv: Path) -> bool:
    """Whether its build finished: ops/peers/setup_llamacpp.sh writes this stamp last."""
    return (venv / ".llamacpp-installed").exists()


def llama_server_binary(venv: Path) -> Path | None:
    """llama.cpp's own server where the venv's setup built it, else None."""
    binary = venv / "bin" / "llama-server"
    return binary if binary.exists() else None


def server_argv(python: Path, gguf: Path, port: int, threads: int, n_ctx: int) -> list[str]:
    """The command line of llama_cpp.server on `gguf`, listening on 127.0.0.1:`port`."""
    return [
        str(python), "-m", "llama_cpp.server",
        "--model", str(gguf),
        "--host", "127.0.0.1", "--port", str(port),
        "--n_threads", str(threads), "--n_threads_batch", str(threads),
        "--n_ctx", str(n_ctx),
        "--interrupt_requests", "False",
        "--logits_all", "False",
    ]  # fmt: skip


def llama_server_argv(
    binary: Path, gguf: Path, port: int, threads: int, slot_ctx: int, parallel: int
) -> list[str]:
    """llama-server on `gguf` with `parallel` slots of `slot_ctx` tokens each, on 127.0.0.1:`port`.

    One KV stream per slot (`--no-kv-unified`): with one shared buffer every sequence's attention spans
    every cell, which the offline peer measured at about 0.6x the speed at 64 sequences."""
    return [
        str(binary),
        "--model", str(gguf),
        "--host", "127.0.0.1", "--port", str(port),
        "--threads", str(threads), "--threads-batch", str(threads),
        "--parallel", str(parallel), "--ctx-size", str(slot_ctx * parallel),
        "--no-kv-unified", "--cont-batching", "--no-webui",
    ]  # fmt: skip


def request_extras(eos_token_ids: list[int]) -> dict[str, Any]:
    """Body fields that make its outputs run to max_tokens (it has no ignore_eos)."""
    return {"logit_bias": {str(t): -100.0 for t in eos_token_ids}}


@contextmanager
def running_server(argv: list[str], base_url: str, log_path: Path, timeout_s: float = 600) -> Iterator[None]:
    """Start `argv` in its own process group, wait until `base_url`/models answers, stop it after."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def exited() -> None:
            if proc.poll() is not None:
                tail = log_path.read_text()[-1500:]
                raise RuntimeError(f"{argv[2:4]} exited {proc.returncode} before serving:\n{tail}")

        try:
            wait_ok(f"{base_url}/models", timeout_s, poll_s=1, check=exited, hint=f" (log: {log_path})")
            yield
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            log.flush()
            log_path.write_text(portable_text(log_path.read_text(errors="replace")))  # a result file too


def compare(ours: dict[str, Any], theirs: dict[str, Any]) -> list[dict[str, Any]]:
    """Per request rate: output tok/s and p50 TPOT of both runs, and ours over theirs."""
    rows = []
    by_rate = {str(r["request_rate"]): r for r in theirs["runs"]}
    for run in ours["runs"]:
        peer = by_rate.get(str(run["request_rate"]))
        if peer is None:
            continue
        row: dict[str, Any] = {"request_rate": run["request_rate"]}
        for name, r in (("pagedserve", run), ("llamacpp", peer)):
            row[name] = {"output_tok_s": r["output_throughput"], "tpot_p50_ms": r["tpot_ms"]["p50"]}
        a, b = row["pagedserve"], row["llamacpp"]
        row["output_ratio"] = round(a["output_tok_s"] / b["output_tok_s"], 3) if b["output_tok_s"] else None
        row["tpot_p50_ratio"] = (
            round(a["tpot_p50_ms"] / b["tpot_p50_ms"], 3) if a["tpot_p50_ms"] and b["tpot_p50_ms"] else None
        )
        rows.append(row)
    return rows


def write_compare_chart(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(r["request_rate"]) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (key, name) in zip(
        axes, (("output_tok_s", "output tok/s"), ("tpot_p50_ms", "p50 TPOT ms")), strict=True
    ):
        for i, peer in enumerate(("pagedserve", "llamacpp")):
            ax.bar(
                [x + i * 0.4 for x in range(len(rows))], [r[peer][key] or 0 for r in rows], 0.4, label=peer
            )
        ax.set_xticks([x + 0.2 for x in range(len(rows))], labels)
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(name)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
