"""The `pagedserve` command: argument wiring, `keys`, `health` rendering, bench/chaos slots."""

from __future__ import annotations

import json
import stat
import sys
import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import zmq.auth
from rich.console import Console

from pagedserve.ops.cli import command as cli
from pagedserve.ops.cli.health_view import render_blocks
from pagedserve.ops.deploy.worker_identity import container_worker_id
from pagedserve.shared.config import ServeConfig, config_from_args

# ---------------------------------------------------------------- argument wiring


def test_service_subcommands_take_every_config_flag() -> None:
    args = cli.build_parser().parse_args(
        ["worker", "--worker-id", "w-7", "--block-size", "32", "--no-enable-prefix-caching"]
    )

    config = config_from_args(args)

    assert args.command == "worker"
    assert (config.worker_id, config.block_size, config.enable_prefix_caching) == ("w-7", 32, False)


def test_service_subcommand_runs_the_service_with_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[ServeConfig] = []
    fake = types.ModuleType("pagedserve.services.scheduler.service")
    fake.run = ran.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pagedserve.services.scheduler.service", fake)

    assert cli.main(["scheduler", "--pipeline-depth", "3", "--scheduler-ops-port", "9000"]) == 0

    assert [(c.pipeline_depth, c.scheduler_ops_port) for c in ran] == [(3, 9000)]


def test_an_invalid_flag_value_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["block-manager", "--block-size", "12"]) == 2
    assert "block_size must be a power of two" in capsys.readouterr().err


def test_up_and_demo_and_generate_parse_their_options() -> None:
    parser = cli.build_parser()
    up = parser.parse_args(["up", "--workers", "3", "--ready-timeout", "5", "--max-num-seqs", "8"])
    demo = parser.parse_args(["demo", "Why is the sky blue?", "--no-stream"])
    gen = parser.parse_args(["generate", "hi", "--max-tokens", "5", "--temperature", "0.5", "--no-stream"])

    assert (up.workers, up.ready_timeout, config_from_args(up).max_num_seqs) == (3, 5.0, 8)
    assert (demo.prompt, demo.stream) == ("Why is the sky blue?", False)
    assert (gen.prompt, gen.max_tokens, gen.temperature, gen.stream, gen.endpoint) == (
        "hi",
        5,
        0.5,
        False,
        None,
    )


def test_a_worker_in_a_container_is_named_after_its_container_id() -> None:
    cid = "3f2a9c0d1e4b" + "0" * 52
    mountinfo = (
        f"612 600 0:58 /var/lib/docker/containers/{cid}/hostname /etc/hostname rw - ext4 /dev/sda1 rw\n"
    )

    assert container_worker_id(mountinfo).endswith("-3f2a9c0d1e4b")


# ---------------------------------------------------------------- bench and chaos slots


def test_bench_passes_its_arguments_to_the_module() -> None:
    seen: list[list[str]] = []
    fake = types.SimpleNamespace(main=lambda argv: seen.append(argv) or 0)

    assert cli.run_passthrough("bench", ["--rate", "4"], import_module=lambda name: fake) == 0
    assert seen == [["--rate", "4"]]


def test_a_missing_chaos_module_is_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    def missing(name: str) -> object:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    assert cli.run_passthrough("chaos", [], import_module=missing) == 2
    assert "pagedserve.ops.chaos is not available" in capsys.readouterr().err


# ---------------------------------------------------------------- keys


def test_keys_writes_loadable_pairs_with_private_secrets(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    assert cli.main(["keys", "--dir", str(keys)]) == 0

    for role in ("server", "client"):
        public, secret = zmq.auth.load_certificate(str(keys / f"{role}.key_secret"))
        assert len(public) == 40 and secret is not None and len(secret) == 40
        assert stat.S_IMODE((keys / f"{role}.key_secret").stat().st_mode) == 0o600
    client_public, _ = zmq.auth.load_certificate(str(keys / "client.key"))
    assert list(zmq.auth.load_certificates(str(keys / "authorized")).keys()) == [client_public]


def test_keys_refuse_to_replace_existing_keys(tmp_path: Path) -> None:
    assert cli.main(["keys", "--dir", str(tmp_path)]) == 0
    assert cli.main(["keys", "--dir", str(tmp_path)]) == 1
    assert cli.main(["keys", "--dir", str(tmp_path), "--force"]) == 0


# ---------------------------------------------------------------- health


def sample_dump(num_blocks: int = 100, violations: list[str] | None = None) -> dict[str, Any]:
    """A /blocks dump: blocks 0-2 held by two requests (0 shared), 3 leaked, 4 free with a cached prefix."""
    blocks: list[dict[str, Any]] = [
        {"id": i, "ref_count": 0, "owners": [], "hash": None, "lease_expires_in_s": None}
        for i in range(num_blocks)
    ]
    blocks[0].update(ref_count=2, owners=["req-a", "req-b"], hash="9f1c2e3d4b5a6978", lease_expires_in_s=8.5)
    blocks[1].update(ref_count=1, owners=["req-a"], lease_expires_in_s=8.5)
    blocks[2].update(ref_count=1, owners=["req-b"], lease_expires_in_s=1.2)
    blocks[3].update(ref_count=1, owners=["req-gone"], lease_expires_in_s=-3.0)
    blocks[4].update(hash="0123456789abcdef")
    totals = {"total": num_blocks, "free": num_blocks - 4, "used": 4, "cached": 2, "leaked": 1}
    return {
        "pools": [
            {
                "worker_id": "worker-0",
                "num_blocks": num_blocks,
                "block_size": 16,
                "blocks": blocks,
                "totals": totals,
            }
        ],
        "leases": [
            {
                "request_id": "req-a",
                "owner": "scheduler",
                "pool_id": "worker-0",
                "expires_in_s": 8.5,
                "num_blocks": 2,
            },
            {
                "request_id": "req-b",
                "owner": "scheduler",
                "pool_id": "worker-0",
                "expires_in_s": 1.2,
                "num_blocks": 2,
            },
        ],
        "totals": totals,
        "invariants": {"ok": not violations, "violations": violations or []},
    }


def rendered(dump: dict[str, Any], **options: Any) -> str:
    console = Console(record=True, width=140, color_system=None)
    console.print(render_blocks(dump, **options))
    return console.export_text()


def test_health_shows_held_blocks_and_collapses_runs_of_free_ones() -> None:
    text = rendered(sample_dump())

    assert "pool worker-0: 100 blocks × 16 tokens" in text
    assert "req-a, req-b" in text and "9f1c2e3d" in text and "9f1c2e3d4" not in text  # hash prefix only
    assert "expired 3.0s ago" in text
    assert "4–99" in text and "96 free, 1 hold a cached prefix" in text  # one row for the free run
    assert "1 leaked" in text
    assert "✓ invariants ok" in text
    assert len(text.splitlines()) < 40


def test_health_shows_every_block_when_asked_and_violations_in_words() -> None:
    text = rendered(
        sample_dump(violations=["pool 'worker-0' block 3: ref_count 1 but 0 table entries"]), show_all=True
    )

    assert "cached prefix" not in text and "01234567" in text and "\n  99 " in text.replace("│", " ")
    assert "✗ 1 invariant violation(s)" in text and "ref_count 1 but 0 table entries" in text


@pytest.fixture
def blocks_endpoint() -> Iterator[tuple[str, dict[str, Any]]]:
    dump = sample_dump(num_blocks=20, violations=["free 1 + used 20 != total 20"])
    body = json.dumps(dump).encode()

    class Ops(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/blocks" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ops)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", dump
    server.shutdown()
    server.server_close()


def test_health_json_prints_the_dump_and_fails_on_violations(
    blocks_endpoint: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, dump = blocks_endpoint

    assert cli.main(["health", "--url", url, "--json"]) == 1  # the dump holds a violation
    assert json.loads(capsys.readouterr().out) == dump


def test_health_of_an_unreachable_block_manager_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["health", "--url", "http://127.0.0.1:9"]) == 2
    assert "cannot read http://127.0.0.1:9/blocks" in capsys.readouterr().err


def test_serve_is_up_with_the_model_first_and_the_api_on_by_default() -> None:
    parser = cli.build_parser()
    serve = parser.parse_args(["serve", "/models/tiny", "--workers", "2", "--api-port", "8100"])
    up = parser.parse_args(["up", "--no-api"])

    assert (serve.served_model, serve.workers, serve.api, config_from_args(serve).api_port) == (
        "/models/tiny",
        2,
        True,
        8100,
    )
    assert up.api is False and up.handler is serve.handler


def test_api_is_a_service_subcommand_with_its_flags() -> None:
    args = cli.build_parser().parse_args(["api", "--api-key", "k", "--served-model-name", "mine"])
    config = config_from_args(args)

    assert cli.SERVICES["api"] == "pagedserve.services.api.server"
    assert (config.api_key, config.served_model_name, config.api_port) == ("k", "mine", 8000)
