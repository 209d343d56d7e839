"""The process supervisor, with tiny `python -c` children standing in for the services."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pagedserve.ops.deploy.process_group import ChildSpec, ProcessGroup, RestartPolicy
from pagedserve.ops.deploy.supervisor import DeploymentFailed, Supervisor, config_env
from pagedserve.shared.config import ServeConfig

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
FAST = RestartPolicy(backoff_s=0.05, max_backoff_s=0.1, max_restarts_per_minute=5)


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it is gone for our purpose once it has no state but Z.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.fixture
def groups() -> Iterator[list[ProcessGroup]]:
    started: list[ProcessGroup] = []
    yield started
    for group in started:
        group.stop(grace_s=1.0)


def start(groups: list[ProcessGroup], *specs: ChildSpec, **kwargs: object) -> ProcessGroup:
    group = ProcessGroup(list(specs), policy=kwargs.pop("policy", FAST), **kwargs)  # type: ignore[arg-type]
    groups.append(group)
    group.start()
    return group


def test_child_killed_by_a_signal_is_restarted(groups: list[ProcessGroup]) -> None:
    group = start(groups, ChildSpec("worker-0", SLEEPER))
    first = group.pid("worker-0")
    assert first is not None

    assert group.send_signal("worker-0", signal.SIGKILL) == first

    wait_for(lambda: group.pid("worker-0") not in (None, first))
    assert group.restarts("worker-0") == 1
    assert process_gone(first)


def test_crash_loop_gives_up_after_the_restarts_allowed_per_minute(groups: list[ProcessGroup]) -> None:
    policy = RestartPolicy(backoff_s=0.01, max_backoff_s=0.02, max_restarts_per_minute=2)
    group = start(groups, ChildSpec("worker-0", [sys.executable, "-c", "raise SystemExit(3)"]), policy=policy)

    wait_for(lambda: group.given_up() == ["worker-0"])
    assert group.restarts("worker-0") == 2
    assert not group.alive("worker-0")


def test_child_that_must_not_restart_is_given_up_when_it_exits(groups: list[ProcessGroup]) -> None:
    group = start(groups, ChildSpec("scheduler", [sys.executable, "-c", "pass"], restart=False))

    wait_for(lambda: group.given_up() == ["scheduler"])
    assert group.restarts("scheduler") == 0


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_stop_terminates_every_child_and_restarts_none(groups: list[ProcessGroup]) -> None:
    group = start(groups, *(ChildSpec(f"worker-{i}", SLEEPER) for i in range(3)))
    pids = [group.pid(f"worker-{i}") for i in range(3)]

    codes = group.stop(grace_s=5.0)

    assert codes == {f"worker-{i}": -signal.SIGTERM for i in range(3)}
    assert all(process_gone(pid) for pid in pids if pid is not None)
    time.sleep(0.2)  # the watcher is gone: nothing comes back
    assert all(group.pid(f"worker-{i}") is None for i in range(3))


def test_stop_kills_a_child_that_ignores_sigterm(groups: list[ProcessGroup], tmp_path: Path) -> None:
    stubborn = textwrap.dedent("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ignoring SIGTERM", flush=True)
        time.sleep(60)
    """)
    group = start(groups, ChildSpec("worker-0", [sys.executable, "-c", stubborn]), log_dir=tmp_path)
    log = tmp_path / "worker-0.log"
    wait_for(lambda: log.exists() and "ignoring" in log.read_text())

    assert group.stop(grace_s=0.3) == {"worker-0": -signal.SIGKILL}


def test_children_die_with_a_supervisor_that_is_killed(tmp_path: Path) -> None:
    # The supervisor itself SIGKILLed (no stop()): the kernel's parent-death signal ends its children.
    parent = textwrap.dedent(f"""
        import sys, time
        from pagedserve.ops.deploy.process_group import ChildSpec, ProcessGroup
        group = ProcessGroup([ChildSpec("worker-0", {SLEEPER!r})])
        group.start()
        print("CHILD", group.pid("worker-0"), flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = ""
        while not line.startswith("CHILD"):  # skip the supervisor's own log lines
            line = proc.stdout.readline()
        child_pid = int(line.split()[1])
        proc.kill()
        proc.wait()
        wait_for(lambda: process_gone(child_pid), timeout_s=5.0)
    finally:
        proc.kill()
        proc.wait()


def test_stop_wakes_a_stopped_child_so_it_shuts_down_cleanly(
    groups: list[ProcessGroup], tmp_path: Path
) -> None:
    # Without the SIGCONT its SIGTERM stays pending while it is stopped: it would be SIGKILLed at
    # the end of the grace period, its sockets never closed.
    graceful = textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
        print("ready", flush=True)
        time.sleep(60)
    """)
    group = start(groups, ChildSpec("worker-0", [sys.executable, "-c", graceful]), log_dir=tmp_path)
    log = tmp_path / "worker-0.log"
    wait_for(lambda: log.exists() and "ready" in log.read_text())
    group.send_signal("worker-0", signal.SIGSTOP)
    # Exit code 3 is its own SIGTERM handler; a child left stopped would be SIGKILLed (-9) at the end
    # of the grace period instead.
    assert group.stop(grace_s=5.0) == {"worker-0": 3}


def test_a_stopped_child_dies_with_a_supervisor_that_is_killed(tmp_path: Path) -> None:
    parent = textwrap.dedent(f"""
        import os, signal, time
        from pagedserve.ops.deploy.process_group import ChildSpec, ProcessGroup
        group = ProcessGroup([ChildSpec("worker-0", {SLEEPER!r})])
        group.start()
        os.kill(group.pid("worker-0"), signal.SIGSTOP)
        print("CHILD", group.pid("worker-0"), flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = ""
        while not line.startswith("CHILD"):
            line = proc.stdout.readline()
        child_pid = int(line.split()[1])
        proc.kill()
        proc.wait()
        wait_for(lambda: process_gone(child_pid), timeout_s=5.0)  # SIGKILL reaches a stopped process
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- Supervisor: a deployment of fakes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_readyz_server(port: int) -> list[str]:
    """A stand-in scheduler whose ops endpoint answers 200 on /readyz."""
    code = textwrap.dedent(f"""
        from http.server import BaseHTTPRequestHandler, HTTPServer
        class Ops(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path == "/readyz" else 404)
                self.end_headers()
            def log_message(self, *args):
                pass
        HTTPServer(("127.0.0.1", {port}), Ops).serve_forever()
    """)
    return [sys.executable, "-c", code]


def test_supervisor_names_its_children_and_passes_the_config() -> None:
    config = ServeConfig(block_size=32, scheduler_ops_port=9123)
    seen: list[tuple[str, str | None]] = []

    def launcher(service: str, worker_id: str | None) -> list[str]:
        seen.append((service, worker_id))
        return SLEEPER

    Supervisor(config, workers=2, launcher=launcher)

    assert seen == [
        ("block-manager", None),
        ("scheduler", None),
        ("worker", "worker-0"),
        ("worker", "worker-1"),
    ]
    seen.clear()
    with_api = Supervisor(config, workers=1, launcher=launcher, api=True)
    assert seen[-1] == ("api", None)
    assert with_api.endpoints()["api"] == "http://127.0.0.1:8000/v1"
    env = config_env(
        config, base={"PATH": "/bin", "PAGEDSERVE_BLOCK_SIZE": "64", "PAGEDSERVE_CACHE": "/models"}
    )
    assert env["PAGEDSERVE_BLOCK_SIZE"] == "32"  # the config wins over an inherited variable
    assert env["PAGEDSERVE_CACHE"] == "/models"  # not a config field: passes through
    assert env["PAGEDSERVE_SCHEDULER_OPS_PORT"] == "9123"
    assert env["PATH"] == "/bin"
    assert "PAGEDSERVE_WORKER_ID" not in env  # each worker gets its own, as a flag


def test_supervisor_is_ready_when_the_scheduler_readyz_answers_and_restarts_killed_workers() -> None:
    port = free_port()
    config = ServeConfig(scheduler_ops_port=port, block_manager_ops_port=free_port())

    def launcher(service: str, worker_id: str | None) -> list[str]:
        return fake_readyz_server(port) if service == "scheduler" else SLEEPER

    with Supervisor(config, workers=2, launcher=launcher, policy=FAST) as supervisor:
        supervisor.wait_ready(timeout_s=10.0)
        assert supervisor.endpoints()["scheduler_ops"] == f"http://127.0.0.1:{port}"

        killed = supervisor.kill_worker(1)
        wait_for(lambda: supervisor.pid("worker-1") not in (None, killed))
        assert supervisor.restarts("worker-1") == 1
        assert supervisor.restarts("worker-0") == 0
        pids = [supervisor.pid(n) for n in ("block-manager", "scheduler", "worker-0", "worker-1")]
    assert all(pid is not None and process_gone(pid) for pid in pids)


def test_wait_ready_fails_fast_when_a_core_service_is_down_for_good(tmp_path: Path) -> None:
    config = ServeConfig(scheduler_ops_port=free_port())

    def launcher(service: str, worker_id: str | None) -> list[str]:
        return [sys.executable, "-c", "raise SystemExit('port taken')"] if service == "scheduler" else SLEEPER

    supervisor = Supervisor(config, workers=1, launcher=launcher, restart_core=False, log_dir=tmp_path)
    # It saw the death: DeploymentFailed names the dead service; waiting the timeout out would raise
    # TimeoutError instead (after an hour: pytest's own timeout would end the test first).
    dead = "scheduler exited and was not restarted.*scheduler.log"
    with supervisor, pytest.raises(DeploymentFailed, match=dead):
        supervisor.wait_ready(timeout_s=3600.0)
    assert "port taken" in (tmp_path / "scheduler.log").read_text()


def test_up_stops_every_child_on_sigterm_and_exits_cleanly(tmp_path: Path) -> None:
    port = free_port()
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from pagedserve.ops.deploy.up import run_up
        from pagedserve.shared.config import ServeConfig
        scheduler = {fake_readyz_server(port)!r}
        def launcher(service, worker_id):
            return scheduler if service == "scheduler" else {SLEEPER!r}
        config = ServeConfig(scheduler_ops_port={port}, block_manager_ops_port={free_port()})
        sys.exit(run_up(config, workers=2, ready_timeout_s=20, log_dir=Path(sys.argv[1]), launcher=launcher))
    """)
    up = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert up.stdout is not None
        lines = []
        while not (lines and lines[-1].startswith("ready in")):
            lines.append(up.stdout.readline())
            assert lines[-1], "up exited before it was ready"
        children = [
            int(pid) for pid in subprocess.check_output(["pgrep", "-P", str(up.pid)], text=True).split()
        ]
        assert len(children) == 4

        up.send_signal(signal.SIGTERM)
        out, _ = up.communicate(timeout=20)

        assert up.returncode == 0
        assert "SIGTERM: stopping" in out and "stopped:" in out
        assert all(process_gone(pid) for pid in children)
    finally:
        up.kill()
        up.wait()


def test_a_restart_is_logged_with_its_cause_in_words():
    from pagedserve.ops.deploy.process_group import exit_cause

    assert [exit_cause(-9), exit_cause(-15), exit_cause(1), exit_cause(0)] == [
        "SIGKILL",
        "SIGTERM",
        "exit 1",
        "exit 0",
    ]
