"""The worker's resident memory with the bundled model loaded in each weight form, one process each.

    .venv/bin/python -m pagedserve.ops.microbench.weights_rss [--model smollm2-135m] [--kv-mib 64]

For each of --quantization none (float32, the GGUF dequantized) and gguf (its stored types: Q4_1
linears, a Q8_0 embedding that is also the tied LM head), a fresh process builds the ModelRunner
a worker builds (the same KV pool for both) and prints its RSS now and its peak (VmHWM), in MiB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, sys
from pathlib import Path
from pagedserve.services.worker.bundled import resolve_model
from pagedserve.services.worker.runner import ModelRunner
runner = ModelRunner(resolve_model(sys.argv[1]), quantization=sys.argv[2], kv_cache_memory=int(sys.argv[3]) << 20)
status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
mib = lambda key: int(status[key].split()[0]) / 1024
print(json.dumps({"quantization": sys.argv[2], "weights": runner.runtime["weights"],
                  "rss_mib": round(mib("VmRSS"), 1), "anon_mib": round(mib("RssAnon"), 1),
                  "file_mib": round(mib("RssFile"), 1), "peak_rss_mib": round(mib("VmHWM"), 1)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--kv-mib", type=int, default=64)
    args = parser.parse_args()
    rows = []
    for quantization in ("none", "gguf"):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, args.model, quantization, str(args.kv_mib)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]))
    print(f"RSS gguf / none: {rows[1]['rss_mib'] / rows[0]['rss_mib']:.2f}")


if __name__ == "__main__":
    main()
