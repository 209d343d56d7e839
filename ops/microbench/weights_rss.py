"""The worker's resident memory with a model loaded in each weight form, one process each, by part.

    .venv/bin/python -m pagedserve.ops.microbench.weights_rss [--models smollm2-135m FOLDER|FILE.gguf...]
        [--quantizations none gguf] [--kv-mib 64]

For each model and each --quantization (none: float32, the GGUF dequantized; gguf: its stored types),
a fresh process builds the ModelRunner a worker builds (the same KV pool for all) and prints, in MiB:
its RSS and peak (VmHWM); the RSS it had before loading (Python, torch and our modules: the same for
every form); the bytes of the model's tensors (weights: quantized blocks, dense and oneDNN-packed
weights, each storage once); the KV pool's bytes; and shared libraries' resident pages. The `rest`
is what is left (the allocator's free lists, Python objects). A Q8_0 file is made by
`python -m pagedserve.ops.models.requantize_gguf Q8_0`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, sys
from pathlib import Path
from pagedserve.ops.microbench.weights_rss import model_bytes, rss_parts
from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.worker.runner import ModelRunner
before = rss_parts()
runner = ModelRunner(resolve_model(sys.argv[1]), quantization=sys.argv[2], kv_cache_memory=int(sys.argv[3]) << 20)
after = rss_parts()
kv = sum(t.numel() * t.element_size() for t in runner.kv_cache.k + runner.kv_cache.v) / 2**20
weights = model_bytes(runner.model) / 2**20
rest = after["rss_mib"] - before["rss_mib"] - weights - kv - (after["libraries_mib"] - before["libraries_mib"])
print(json.dumps({"model": sys.argv[1], "quantization": sys.argv[2], "weights": runner.runtime["weights"],
                  **after, "before_load_mib": before["rss_mib"], "weights_mib": round(weights, 1),
                  "kv_pool_mib": round(kv, 1), "rest_mib": round(rest, 1)}))
"""


def rss_parts() -> dict[str, float]:
    """This process's RSS, anonymous and file-backed parts, peak, and the shared libraries' pages (MiB)."""
    from pathlib import Path

    status = dict(
        line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line
    )
    libraries = 0
    mapping = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            mapping = fields[5] if len(fields) > 5 else ""
        elif fields[0] == "Rss:" and ".so" in mapping:
            libraries += int(fields[1])

    def mib(key: str) -> float:
        return round(int(status[key].split()[0]) / 1024, 1)

    return {
        "rss_mib": mib("VmRSS"),
        "anon_mib": mib("RssAnon"),
        "file_mib": mib("RssFile"),
        "peak_rss_mib": mib("VmHWM"),
        "libraries_mib": round(libraries / 1024, 1),
    }


def model_bytes(model) -> int:
    """Bytes of every tensor the model holds (parameters, buffers, quantized blocks, packed weights,
    plain tensor attributes), each storage counted once (a tied head shares the embedding's blocks)."""
    import torch

    seen: set[int] = set()
    total = 0
    for module in model.modules():
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        tensors += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
        for tensor in tensors:
            key = id(tensor) if tensor.is_mkldnn else tensor.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += tensor.numel() * tensor.element_size()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m"])
    parser.add_argument("--quantizations", nargs="+", default=["none", "gguf"])
    parser.add_argument("--kv-mib", type=int, default=64)
    args = parser.parse_args()
    for model in args.models:
        rows = []
        for quantization in args.quantizations:
            done = subprocess.run(
                [sys.executable, "-c", CHILD, model, quantization, str(args.kv_mib)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]))
        if len(rows) > 1:
            first = rows[0]
            for row in rows[1:]:
                print(
                    f"{model}: {row['quantization']} / {first['quantization']}: RSS "
                    f"{row['rss_mib'] / first['rss_mib']:.2f}, weights {row['weights_mib'] / first['weights_mib']:.2f}"
                )


if __name__ == "__main__":
    main()
