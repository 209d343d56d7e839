"""`pagedserve chaos stress`: the services' integration tests in a loop on a loaded machine, for a
bounded time, with random worker kills if asked; the lane that hunts hangs like the 120 s one.

    pagedserve chaos stress --minutes 10                       load: stress-ng (or Python hogs), 1 per core
    pagedserve chaos stress --minutes 60 --kill-worker-every 20   and SIGKILL a random worker now and then
    pagedserve chaos stress --minutes 5 --select "two_workers and depth"   only some tests (pytest -k)

Each round is one `pytest` run of `--tests` (default tests/integration/test_services.py) with its
own folder under `--out` (every service's log: a step that passes its hang threshold dumps the
scheduler's and the worker's stacks there). A passing round's folder is deleted, a failing one is
kept. The hogs and the tests run under `nice` so that a shared machine stays usable. At the end a
JSON report (`stress-report.json` in `--out`): rounds, failures with their folders, the step
timeouts and stack dumps seen in the logs. Exit 0 only if no round failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pagedserve.kernels.cpu.isa import cpu_model

# Log events that mark a hang suspect (services/scheduler/service.py, services/worker/service.py).
SUSPECT_EVENTS = ("step_timeout", "step_overdue_dumping_stacks", "dumping_stacks", "worker_lost")
KILLS_ENV = "PAGEDSERVE_STRESS_KILL_EVERY_S"  # set in each round when workers are being killed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="pagedserve chaos stress",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--minutes", type=float, default=10.0, help="stop starting rounds after this long")
    ap.add_argument("--tests", default="tests/integration/test_services.py", help="what each round runs")
    ap.add_argument("--select", default=None, help="pytest -k expression within --tests")
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="CPU hogs loading the machine")
    ap.add_argument("--nice", type=int, default=10, help="niceness of the hogs and the tests")
    ap.add_argument(
        "--kill-worker-every",
        type=float,
        default=None,
        metavar="S",
        help="SIGKILL a random worker every ~S s",
    )
    ap.add_argument(
        "--round-timeout", type=float, default=900.0, help="seconds before a round counts as hung"
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="folder of the rounds and the report (default: a temp one)"
    )
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def start_hogs(count: int, niceness: int) -> list[subprocess.Popen[bytes]]:
    """stress-ng's CPU workers where installed (Debian: apt-get install stress-ng), else busy Pythons."""
    nice = ["nice", "-n", str(niceness)]
    if count <= 0:
        return []
    if shutil.which("stress-ng"):
        return [
            subprocess.Popen([*nice, "stress-ng", "--cpu", str(count), "--quiet"], start_new_session=True)
        ]
    spin = "while True: pass"
    return [
        subprocess.Popen([*nice, sys.executable, "-c", spin], start_new_session=True) for _ in range(count)
    ]


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc: each process's parent)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def is_service(pid: int) -> bool:
    return b"pagedserve.ops.cli" in _argv(pid)


def is_worker(pid: int) -> bool:
    return is_service(pid) and b"worker" in _argv(pid)


def kill_workers(
    round_pid: int, every_s: float, rng: random.Random, done: threading.Event, kills: list[float]
) -> None:
    """SIGKILL a random worker of this round's deployments every ~every_s (the supervisor restarts it)."""
    while not done.wait(rng.uniform(0.5 * every_s, 1.5 * every_s)):
        workers = [p for p in descendants(round_pid) if is_worker(p)]
        if workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rng.choice(workers), signal.SIGKILL)
                kills.append(time.time())


def suspects(folder: Path) -> dict[str, int]:
    counts = dict.fromkeys(SUSPECT_EVENTS, 0)
    for log in folder.rglob("*.log"):
        text = log.read_text(errors="replace")
        for event in SUSPECT_EVENTS:
            counts[event] += text.count(f'"event": "{event}"')
    return counts


def run_round(index: int, args: argparse.Namespace, out: Path, rng: random.Random) -> dict[str, Any]:
    folder = out / f"round-{index:04d}"
    cmd = ["nice", "-n", str(args.nice), sys.executable, "-m", "pytest", args.tests, "-x", "-q"]
    cmd += ["-p", "no:cacheprovider", f"--basetemp={folder}"]
    if args.select:
        cmd += ["-k", args.select]
    t0 = time.monotonic()
    with open(out / f"round-{index:04d}.out", "wb") as log:
        env = dict(os.environ)
        if args.kill_worker_every:
            # Tests that claim which worker served (not only what came back) read this and drop that claim.
            env[KILLS_ENV] = str(args.kill_worker_every)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        done, kills = threading.Event(), []
        killer = None
        if args.kill_worker_every:
            killer = threading.Thread(
                target=kill_workers, args=(proc.pid, args.kill_worker_every, rng, done, kills), daemon=True
            )
            killer.start()
        try:
            code = proc.wait(timeout=args.round_timeout)
        except subprocess.TimeoutExpired:
            # A hang: our stacks' dumps are in the services' logs; the test process's too, now.
            for pid in descendants(proc.pid):
                if is_service(pid):  # services print their stacks on SIGUSR1; anything else it kills
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGUSR1)
            time.sleep(2.0)
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        finally:
            done.set()
            if proc.poll() is None:  # the lane itself was stopped: its round goes with it
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    result = {
        "round": index,
        "exit_code": code,
        "seconds": round(time.monotonic() - t0, 1),
        "worker_kills": len(kills),
        "suspects": suspects(folder) if folder.exists() else {},
    }
    if code == 0:
        shutil.rmtree(folder, ignore_errors=True)
        (out / f"round-{index:04d}.out").unlink(missing_ok=True)
    else:
        result["kept"] = str(folder)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="pagedserve-stress-"))
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop the round and the hogs (their own sessions).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    hogs = start_hogs(args.hogs, args.nice)
    rounds: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60.0 * args.minutes
    try:
        while time.monotonic() < deadline:
            result = run_round(len(rounds), args, out, rng)
            rounds.append(result)
            print(json.dumps(result), flush=True)
    finally:
        stop_all(hogs)
    failed = [r for r in rounds if r["exit_code"] != 0]
    report = {
        "minutes": args.minutes,
        "tests": args.tests,
        "select": args.select,
        "hogs": args.hogs,
        "hog_kind": "stress-ng" if shutil.which("stress-ng") else "python",
        "kill_worker_every_s": args.kill_worker_every,
        "cpu": cpu_model(),
        "rounds": len(rounds),
        "failures": len(failed),
        "failed_rounds": failed,
        "suspects": {e: sum(r["suspects"].get(e, 0) for r in rounds) for e in SUSPECT_EVENTS},
    }
    (out / "stress-report.json").write_text(json.dumps(report, indent=2))
    print(f"stress: {len(rounds)} rounds, {len(failed)} failed; report {out / 'stress-report.json'}")
    return 0 if rounds and not failed else 1
