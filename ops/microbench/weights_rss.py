"""The worker's resident memory with a model loaded in each weight form, one process each, by part.

    .venv/bin/python -m pagedserve.ops.microbench.weights_rss [--models smollm2-135m FOLDER|FILE.gguf...]
        [--quantizations none gguf] [--kv-mib 64]

For each model and each --quantization (none: float32, the GGUF dequantized; gguf: its stored types),
a fresh process builds the ModelRunner a worker builds (the same KV pool for all) and prints, in MiB:
its RSS and peak (VmHWM); the RSS it had before loading (Python, torch and our modules: the same for
every form); the bytes of the model's tensors (weights: quantized blocks, dense and oneDNN-packed
weights, each storage once); the KV pool's bytes; and shared libraries' resident pages. The `rest`
is what is left (the allocator's free lists, Python objects). `step_read_mib`: the weight bytes one
decode step reads (step_read_bytes), beside llama.cpp's for the folder's GGUF (the same tensors as
stored). A Q8_0 or Q4_K_M file is made by `python -m pagedserve.ops.models.requantize_gguf Q8_0`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, sys
from pathlib import Path
from pagedserve.ops.microbench.weights_rss import model_bytes, rss_parts, step_read_bytes
from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.worker.runner import ModelRunner
before = rss_parts()
runner = ModelRunner(resolve_model(sys.argv[1]), quantization=sys.argv[2], kv_cache_memory=int(sys.argv[3]) << 20)
after = rss_parts()
kv = sum(t.numel() * t.element_size() for t in runner.kv_cache.k + runner.kv_cache.v) / 2**20
weights = model_bytes(runner.model) / 2**20
step = step_read_bytes(runner.model) / 2**20
rest = after["rss_mib"] - before["rss_mib"] - weights - kv - (after["libraries_mib"] - before["libraries_mib"])
print(json.dumps({"model": sys.argv[1], "quantization": sys.argv[2], "weights": runner.runtime["weights"],
                  **after, "before_load_mib": before["rss_mib"], "weights_mib": round(weights, 1),
                  "kv_pool_mib": round(kv, 1), "rest_mib": round(rest, 1),
                  "step_read_mib": round(step, 1)}))
"""


def rss_parts() -> dict[str, float]:
    """This process's RSS, anonymous and file-backed parts, peak, and the shared libraries' pages (MiB)."""
    from pathlib import Path

    from pagedserve.shared.proc_memory import memory_kib

    status = memory_kib()
    libraries = 0
    mapping = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            mapping = fields[5] if len(fields) > 5 else ""
        elif fields[0] == "Rss:" and ".so" in mapping:
            libraries += int(fields[1])

    def mib(key: str) -> float:
        return round(status[key] / 1024, 1)

    return {
        "rss_mib": mib("VmRSS"),
        "anon_mib": mib("RssAnon"),
        "file_mib": mib("RssFile"),
        "peak_rss_mib": mib("VmHWM"),
        "libraries_mib": round(libraries / 1024, 1),
    }


def held_tensors(module) -> list:
    """The tensors `module` itself holds: parameters, buffers, tensor attributes and tensors inside list
    or tuple attributes (a QuantLinear's runs of blocks, one per type)."""
    import torch

    def within(value) -> list:
        if isinstance(value, torch.Tensor):
            return [value]
        if isinstance(value, (list, tuple)):
            return [t for v in value for t in within(v)]
        return []

    tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    return tensors + [t for v in vars(module).values() for t in within(v)]


def model_bytes(model) -> int:
    """Bytes of every tensor the model holds (parameters, buffers, quantized blocks, packed weights,
    plain tensor attributes), each storage counted once (a tied head shares the embedding's blocks)."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        for tensor in held_tensors(module):
            key = id(tensor) if tensor.is_mkldnn else tensor.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += tensor.numel() * tensor.element_size()
    return total


def step_read_bytes(model) -> int:
    """Weight bytes one decode step reads: every linear's weight once (quantized blocks as stored, a
    dense or oneDNN-packed matrix in its dtype), the LM head included (a tied one reads the embedding's
    blocks again); embedding lookups read a few rows and are left out."""
    from torch import nn

    from pagedserve.services.worker.layers.packed_linear import PackedLinear
    from pagedserve.services.worker.layers.quant_linear import QuantLinear

    total = 0
    for module in model.modules():
        if isinstance(module, QuantLinear):
            total += sum(blocks.nbytes for _, blocks, _ in module.runs)
        elif isinstance(module, PackedLinear):
            total += module.out_features * module.in_features * module.packed_weight.element_size()
        elif isinstance(module, nn.Linear):
            total += module.weight.nbytes
    return total


def gguf_step_read_bytes(path) -> int:
    """The same for llama.cpp on a GGUF: every matrix as stored but the token embedding, which it reads
    only as the LM head where the file has no output.weight (a tied head)."""
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors if len(t.shape) >= 2}
    tied = "output.weight" not in tensors
    return sum(int(t.n_bytes) for name, t in tensors.items() if name != "token_embd.weight" or tied)


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
        from pagedserve.services.checkpoint import resolve_model
        from pagedserve.services.worker.weights.gguf_weights import gguf_source

        source = gguf_source(resolve_model(model))
        if source is not None:
            print(
                f"{model}: llama.cpp reads {gguf_step_read_bytes(source) / 2**20:.1f} MiB a step of {source.name}"
            )
        if len(rows) > 1:
            first = rows[0]
            for row in rows[1:]:
                print(
                    f"{model}: {row['quantization']} / {first['quantization']}: RSS "
                    f"{row['rss_mib'] / first['rss_mib']:.2f}, weights {row['weights_mib'] / first['weights_mib']:.2f}"
                )


if __name__ == "__main__":
    main()
