"""Client frameworks nobody here wrote, driving a local deployment of ours.

    python -m pagedserve.ops.clients.drive [--model smollm2-135m] [--clients agents_sdk] \
        [--venv .venv-clients] [--out bench/results/clients.json]

Starts the deployment (block manager, scheduler, one worker, the API) on free loopback ports, then
runs each client's script (ops/clients/<name>.py) with the clients' venv's python (ops/clients/setup.sh
makes it: the frameworks never enter the project's venv). A script prints `PASS name: ...` or
`FAIL name: ...` per check and exits with its failure count; the report gathers the lines.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
from pathlib import Path

from pagedserve.kernels.cpu.isa import cpu_model
from pagedserve.ops.deploy.local_api import serving_api
from pagedserve.ops.results import write_json

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def run_client(python: Path, name: str, base: str, timeout_s: float) -> dict[str, object]:
    argv = [str(python), str(HERE / f"{name}.py"), "--base-url", f"{base}/v1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(("PASS ", "FAIL "))]
    sys.stdout.write(done.stdout)
    if done.returncode:
        sys.stdout.write(done.stderr[-4000:])
    return {"exit_status": done.returncode, "checks": lines}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--clients", default="agents_sdk,langchain_responses")
    ap.add_argument("--venv", type=Path, default=REPO / ".venv-clients")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per client script")
    ap.add_argument("--out", type=Path, default=Path("bench/results/clients.json"))
    args = ap.parse_args(argv)
    python = args.venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no {python}: run ops/clients/setup.sh first")
    results = {}
    with serving_api(args.model, tool_call_parser="hermes") as base:
        for name in args.clients.split(","):
            results[name] = run_client(python, name, base, args.timeout)
    failed = sum(1 for r in results.values() if r["exit_status"])
    write_json(
        args.out,
        {"benchmark": "clients", "cpu": cpu_model(), "machine": platform.machine(), "model": args.model,
         "clients": results},
    )  # fmt: skip
    return failed


if __name__ == "__main__":
    sys.exit(main())
