"""`pagedserve top` in a real terminal (tmux), against a real deployment: what a person watches.

It must show the workers and the pool, follow requests as they run, and show a ghost owner's
lapsed lease as leaked blocks until it is reaped. The screen is read with `tmux capture-pane`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import urllib.request
import uuid

import pytest
from deployment import start, wait_for
from ghost_owner import ghost_allocate

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)"
)

TOKEN = "top-test-token"


def screen(session: str) -> str:
    out = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True)
    return out.stdout


def number_after(label: str, text: str) -> int | None:
    found = re.search(rf"{label} (\d+)", text)
    return None if found is None else int(found.group(1))


def test_top_follows_requests_and_shows_a_leak_until_reaped(tiny_model, tmp_path):
    sup = start(
        tiny_model("llama"),
        workers=1,
        log_dir=tmp_path,
        num_blocks=256,
        admin_token=TOKEN,
        lease_ttl_s=2.0,
        lease_renew_interval_s=0.4,
        reap_interval_s=3600.0,  # the test reaps through /admin/reap: the leak stays until then
    )
    session = f"top-{uuid.uuid4().hex[:8]}"
    command = (
        f"{sys.executable} -m pagedserve.ops.cli top --scheduler-url {sup.scheduler_ops_url} "
        f"--block-manager-url {sup.block_manager_ops_url} --token {TOKEN} --interval 0.3"
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "60", command], check=True)
    try:
        shown = wait_for(lambda: "worker-0" in (s := screen(session)) and "active" in s and s, 60)
        assert shown, screen(session)
        assert "invariants ✓ ok" in shown and "pool 0/256 used" in shown

        from pagedserve import Client

        with Client(sup.front_endpoint, timeout_s=120) as client:
            stream = client.stream(prompt_token_ids=list(range(3, 80)), max_tokens=200, ignore_eos=True)
            running = wait_for(lambda: (number_after("running", screen(session)) or 0) > 0, 60)
            assert running, screen(session)
            for _ in stream:
                pass
        assert wait_for(lambda: "pool 0/256 used" in (s := screen(session)) and "running 0" in s, 60), screen(
            session
        )

        tables = ghost_allocate(sup.config.block_manager_endpoint, "worker-0", [[250] * 40], "ghost")
        assert wait_for(lambda: number_after("leaked", screen(session)) == len(tables[0]), 30), screen(
            session
        )
        reap = urllib.request.Request(
            f"{sup.block_manager_ops_url}/admin/reap",
            method="POST",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(reap, timeout=10)
        assert wait_for(lambda: number_after("leaked", screen(session)) == 0, 30), screen(session)

        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
        gone = wait_for(
            lambda: (
                subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode != 0
            ),
            10,
        )
        assert gone, "top did not exit on Ctrl-C"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        sup.stop()
