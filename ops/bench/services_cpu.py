"""CPU each process of a running `pagedserve serve` spends per output token, under `bench serve` load.

    python -m pagedserve.ops.bench.services_cpu SERVE_PID http://127.0.0.1:8000/v1 [--rounds 3]

Each round runs `pagedserve bench serve` (random 128-token prompts, 128 tokens out, one request in
flight by default: where the services' share of a small machine shows most) after one warm-up, and
prints, per process under SERVE_PID, its user + system CPU over the round divided by the tokens
generated, beside the round's TPOT. On a machine whose cores the worker's threads fill, every
millisecond here is taken from the model's step. Reads /proc (Linux).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from pagedserve.ops.bench.fleet import cpu_seconds
from pagedserve.ops.bench.rss_peaks import command, descendants


def process_name(pid: int) -> str:
    """`scheduler`, `worker --worker-id worker-0`, ...: the service command without the interpreter."""
    cmd = command(pid)
    return cmd.split("pagedserve.ops.cli ", 1)[-1]


def load(base_url: str, args: argparse.Namespace, prompts: int) -> dict:
    """One `bench serve` run against the server: its JSON report."""
    with tempfile.TemporaryDirectory() as out:
        report = Path(out) / "serve.json"
        subprocess.run(
            [sys.executable, "-m", "pagedserve.ops.cli", "bench", "serve", "--base-url", base_url,
             "--workload", "random", "--request-rate", "inf", "--no-progress",
             "--num-prompts", str(prompts), "--max-concurrency", str(args.concurrency),
             "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--out", str(report)],
            check=True, capture_output=True,
        )  # fmt: skip
        return json.loads(report.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("serve_pid", type=int)
    ap.add_argument("base_url")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    pids = descendants(args.serve_pid)
    load(args.base_url, args, 2)  # warm-up: compiled kernels, first allocations
    for _ in range(args.rounds):
        before = {pid: cpu_seconds(pid) for pid in pids}
        report = load(args.base_url, args, args.num_prompts)
        after = {pid: cpu_seconds(pid) for pid in pids}
        run = report["runs"][0]
        tokens, tpot = run["total_output_tokens"], run["tpot_ms"]
        busy = {process_name(p): (after[p] - before[p]) * 1e3 / tokens for p in pids if after[p] > before[p]}
        print(f"TPOT p50 {tpot['p50']:.1f} ms | CPU ms per token: "
              + ", ".join(f"{name} {ms:.2f}" for name, ms in busy.items()))  # fmt: skip


if __name__ == "__main__":
    main()
