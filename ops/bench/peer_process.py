"""One peer run in its own venv: the workload goes to its script as a JSON file, the result comes back
as one. A script that dies without a result is that path's error (its output's tail printed), not a
crash of the bench."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pagedserve.ops.bench.peers import PathResult

_KNOWN = {"name", "output_tokens", "wall_s", "tokens_per_s", "error"}


def run_peer_process(
    name: str, python: Path, script: Path, request: dict[str, Any], timeout_s: float
) -> PathResult:
    with tempfile.TemporaryDirectory(prefix=f"pagedserve-{name}-") as tmp:
        request_path, result_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request_path.write_text(json.dumps(request))
        proc = subprocess.run(
            [str(python), str(script), str(request_path), str(result_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if not result_path.exists():
            tail = proc.stdout[-2000:]
            print(tail, file=sys.stderr)
            return PathResult(
                name, error=f"{script.name} exited {proc.returncode} without a result: {tail[-300:]}"
            )
        result = json.loads(result_path.read_text())
    return PathResult(
        name,
        output_tokens=int(result["output_tokens"]),
        wall_s=float(result["wall_s"]),
        error=result["error"],
        details={k: v for k, v in result.items() if k not in _KNOWN},
    )
