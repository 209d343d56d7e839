"""With CURVE keys on, only a client holding the authorized key pair can submit."""

from __future__ import annotations

import zmq
from harness.deployment import start

from pagedserve import Client
from pagedserve.ops.cli.keys import create_keys
from pagedserve.shared.protocol.codec import encode
from pagedserve.shared.sdk import load_client_keys


def test_client_without_the_curve_key_cannot_submit(tiny_model, tmp_path):
    keys = tmp_path / "keys"
    create_keys(keys)
    sup = start(tiny_model("llama"), workers=1, log_dir=tmp_path, curve_keys_dir=str(keys))
    try:
        with Client(sup.front_endpoint, timeout_s=60, **load_client_keys(keys)) as client:
            assert (
                len(client.generate(prompt_token_ids=[5, 6, 7], max_tokens=3, temperature=0.0).token_ids) == 3
            )

        ctx = zmq.Context()
        plain = ctx.socket(zmq.DEALER)
        plain.setsockopt(zmq.LINGER, 0)
        plain.connect(sup.front_endpoint)
        plain.send(encode("submit", {"request_id": "intruder", "prompt_token_ids": [5, 6, 7]}))
        assert not plain.poll(3000), "a client without keys got an answer"

        stranger = ctx.socket(zmq.DEALER)  # CURVE, but a key pair the server never authorized
        stranger.setsockopt(zmq.LINGER, 0)
        stranger.curve_publickey, stranger.curve_secretkey = zmq.curve_keypair()
        stranger.curve_serverkey = load_client_keys(keys)["curve_server_public_key"]
        stranger.connect(sup.front_endpoint)
        stranger.send(encode("submit", {"request_id": "stranger", "prompt_token_ids": [5, 6, 7]}))
        assert not stranger.poll(3000), "an unauthorized key got an answer"
        plain.close(0)
        stranger.close(0)
        ctx.term()
    finally:
        sup.stop()
