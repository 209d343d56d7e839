"""A service prints every thread's stack on SIGUSR1 and keeps running: how to see what a hung
step is stuck on without stopping the process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from harness.deployment import free_ports


def test_sigusr1_dumps_every_thread_and_the_service_lives_on(tmp_path):
    (bm,) = free_ports(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEDSERVE_")}
    env |= {
        "PAGEDSERVE_BLOCK_MANAGER_ENDPOINT": f"tcp://127.0.0.1:{bm}",
        "PAGEDSERVE_BLOCK_MANAGER_OPS_PORT": "0",
    }
    log = tmp_path / "bm.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pagedserve.ops.cli", "block-manager"], env=env, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 30
        while b"block_manager_started" not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while b"Current thread" not in log.read_bytes():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert b'File "' in log.read_bytes()
        time.sleep(0.5)
        assert proc.poll() is None  # a dump, not a death
    finally:
        proc.terminate()
        proc.wait(10)
