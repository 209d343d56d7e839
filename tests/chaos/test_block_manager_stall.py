"""A block manager that stalls (here: SIGSTOP, shorter than rpc_timeout_s) delays the steps waiting
for its answers, never the scheduler's reading of its sockets: a client's ping is answered while the
block manager is still stopped, and once it runs again the request finishes with the very tokens of a
run without the stall, nothing counted as an outage, nothing leaked. Workers are simulated (no
model): what is under test is the control plane."""

from __future__ import annotations

import os
import signal
import threading
import time

import zmq
from harness.deployment import assert_no_leak, deployment_config, get_text

from pagedserve import Client
from pagedserve.ops.deploy.supervisor import Supervisor
from pagedserve.shared.protocol.codec import decode, encode

PROMPT = [11, 12, 13, 14, 15]
MAX_TOKENS = 200
STALL_S = 2.0


def outages(sup: Supervisor) -> float:
    for line in get_text(f"{sup.scheduler_ops_url}/metrics").splitlines():
        if line.startswith("pagedserve_block_manager_outages_total "):
            return float(line.split()[1])
    raise AssertionError("no pagedserve_block_manager_outages_total in the scheduler's metrics")


def test_pings_are_answered_while_the_block_manager_is_stopped(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        '{"vocab_size": 320, "max_position_embeddings": 512, "eos_token_id": 2}'
    )
    config = deployment_config(model, num_blocks=256, simulate_step_ms=10, rpc_timeout_s=4 * STALL_S)
    sup = Supervisor(config, workers=1, log_dir=tmp_path / "logs").start()
    ctx = zmq.Context()
    probe = ctx.socket(zmq.DEALER)
    try:
        sup.wait_ready(timeout_s=60)
        kw = {"prompt_token_ids": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
        with Client(sup.front_endpoint, timeout_s=60) as client:
            want = client.generate(**kw).token_ids
        got: dict = {}
        streaming = threading.Event()

        def generate() -> None:
            with Client(sup.front_endpoint, timeout_s=60) as c:
                stream = c.stream(**kw)
                tokens: list[int] = []
                for delta in stream:
                    tokens += delta.token_ids
                    streaming.set()
                got["tokens"] = tokens

        thread = threading.Thread(target=generate, daemon=True)
        thread.start()
        assert streaming.wait(30), "the request never streamed"
        probe.connect(sup.front_endpoint)
        bm = sup.pid("block-manager")
        assert bm is not None
        os.kill(bm, signal.SIGSTOP)
        try:
            stopped_until = time.monotonic() + STALL_S
            pongs = 0
            while time.monotonic() < stopped_until - 0.5:
                probe.send(encode("ping", {}))
                assert probe.poll(int(STALL_S * 1000)), "the scheduler stopped reading its front socket"
                assert decode(probe.recv())["type"] == "pong"
                pongs += 1
                time.sleep(0.1)
            assert pongs >= 5
            assert "tokens" not in got  # it is still waiting for the block manager
        finally:
            os.kill(bm, signal.SIGCONT)
        thread.join(timeout=60)
        assert got["tokens"] == want
        assert outages(sup) == 0
        assert_no_leak(sup, expect_pools=1)
    finally:
        probe.close(0)
        ctx.term()
        sup.stop()
