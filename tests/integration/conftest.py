"""Fixtures of the HTTP API tests: one deployment and one API process for the whole session."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness.api_server import ApiServer, with_chat_template
from harness.deployment import start

from pagedserve.ops.deploy.supervisor import Supervisor

API_KEY = "test-key-123"


@dataclass
class ApiDeployment:
    sup: Supervisor
    api: ApiServer
    model_path: Path
    model_name: str
    api_key: str
    log_dir: Path


@pytest.fixture(scope="session")
def api_deployment(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiDeployment]:
    """A tiny llama with a chat template, one worker, and the API (with an API key) in front."""
    folder = tmp_path_factory.mktemp("api-model") / "tiny-chat"
    shutil.copytree(tiny_model("llama"), folder)
    with_chat_template(folder)
    logs = tmp_path_factory.mktemp("api-logs")
    sup = start(folder, workers=1, log_dir=logs, pipeline_depth=2)
    api = ApiServer(sup.config, logs / "api.log", "--api-key", API_KEY)
    try:
        api.wait_healthy()
        yield ApiDeployment(sup, api, folder, "tiny-chat", API_KEY, logs)
    finally:
        api.stop()
        sup.stop()


@dataclass
class WordModelDeployment:
    sup: Supervisor
    model_path: Path
    log_dir: Path


@pytest.fixture(scope="session")
def word_model_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WordModelDeployment]:
    """A tiny Qwen3 in Qwen3-Reranker form ("yes"/"no" single tokens, <think> tags, a Qwen-style chat
    template), one worker, no API: each test module puts the API processes it needs in front."""
    from harness.pooling_models import make_tiny_reranker

    folder = make_tiny_reranker(tmp_path_factory.mktemp("word-model") / "tiny-reranker")
    logs = tmp_path_factory.mktemp("word-logs")
    sup = start(folder, workers=1, log_dir=logs, max_num_batched_tokens=64)
    try:
        yield WordModelDeployment(sup, folder, logs)
    finally:
        sup.stop()
