"""Micro-benchmark: one Sampler.sample call over a SmolLM2-sized vocabulary, per setting, dtype, batch
and sampler backend.

    python -m pagedserve.ops.microbench.sampler [--batches 1 8 32 64] [--dtypes float32 bfloat16]
        [--backends torch cpp] [--isas avx2 portable] [--baseline old_sampling.cpp]
        [--threads 2] [--repeats 15] [--out bench/results/sampler.json]

`--isas` measures the C++ op on each named ISA path (columns cpp_avx2, cpp_portable...) instead of
the best one alone; `--baseline` adds the op built from another sampling.cpp (say an older revision,
`git show REV:kernels/cpu/sampling.cpp > old.cpp`) on the first of those paths (columns base_<isa>).

Every setting but greedy runs at the bench workload's temperature, 0.6. Logits are N(0, 3^2):
flatter than a real model's, so top-p nuclei are wide (a few hundred tokens) and the truncation
search is near its worst case; `--logit-std` changes that. The backends alternate call by call in
one process (an A/B on the same cores at the same moment); medians and minima in milliseconds per call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from pagedserve.kernels.cpu.build import HERE, Extension, load_extension
from pagedserve.kernels.cpu.isa import ISAS, cpu_model
from pagedserve.ops.microbench.ab_report import measured, write_report
from pagedserve.services.worker.sampler import Sampler, SamplingRequest
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import WorkerSampling

VOCAB = 49152
TEMPERATURE = 0.6
SETTINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "temperature": {},
    "top_p=0.9": {"top_p": 0.9},
    "top_k=50": {"top_k": 50},
    "top_k=50,top_p=0.9": {"top_k": 50, "top_p": 0.9},
    "min_p=0.05": {"min_p": 0.05},
    "seeded": {"seed": 3},
    "penalties": {"repetition_penalty": 1.2, "frequency_penalty": 0.5},
    "logprobs=5": {"logprobs": 5},
}


def _requests(setting: dict[str, Any], batch: int) -> list[SamplingRequest]:
    params = SamplingParams(**{"temperature": TEMPERATURE, **setting})
    fields = WorkerSampling.of(params, params.seed)
    # 64 prompt and 64 output tokens each, as a mid-generation decode step.
    return [SamplingRequest(fields, list(range(64)), list(range(100, 164))) for _ in range(batch)]


def _samplers(args: argparse.Namespace) -> dict[str, Sampler]:
    """Column name -> sampler: torch, cpp (the best path) or cpp_<isa> per --isas, base_<isa>."""
    samplers = {}
    for backend in args.backends:
        if backend == "cpp" and args.isas:
            for isa in args.isas:
                samplers[f"cpp_{isa}"] = Sampler(VOCAB, eos_token_ids=[2], backend="cpp", isa=isa)
        else:
            samplers[backend] = Sampler(VOCAB, eos_token_ids=[2], backend=backend)
    if args.baseline:
        isa = args.isas[0] if args.isas else next((s.isa for s in samplers.values() if s.isa), "portable")
        # Its own extension name, so its op loads beside this tree's; library.h from this tree.
        extension = Extension("sampling_baseline", (args.baseline.resolve(),), (f"-I{HERE}",))
        baseline = Sampler(VOCAB, eos_token_ids=[2], backend="cpp", isa=isa)
        baseline._sample_rows = load_extension(extension, isa).sample_rows.default
        samplers[f"base_{isa}"] = baseline
    return samplers


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    samplers = _samplers(args)
    rows = []
    for dtype_name in args.dtypes:
        for batch in args.batches:
            generator = torch.Generator().manual_seed(batch)
            logits = (torch.randn(batch, VOCAB, generator=generator) * args.logit_std).to(
                getattr(torch, dtype_name)
            )
            for name in args.settings:
                requests = _requests(SETTINGS[name], batch)
                seconds: dict[str, list[float]] = {backend: [] for backend in samplers}
                for sampler in samplers.values():
                    sampler.sample(logits, requests)  # warm-up
                for _ in range(args.repeats):
                    for backend, sampler in samplers.items():
                        started = time.perf_counter()
                        sampler.sample(logits, requests)
                        seconds[backend].append(time.perf_counter() - started)
                row: dict[str, Any] = {"setting": name, "dtype": dtype_name, "batch": batch}
                row |= {f"{b}_ms": round(statistics.median(s) * 1e3, 3) for b, s in seconds.items()}
                # The fastest call too: on shared cores a preempted call inflates the median.
                row |= {f"{b}_min_ms": round(min(s) * 1e3, 3) for b, s in seconds.items()}
                rows.append(row)
                print(
                    f"{name:>20} {dtype_name:>8} B={batch:<4} "
                    + "  ".join(
                        f"{b} {row[f'{b}_ms']:8.3f} ms (min {row[f'{b}_min_ms']:7.3f})" for b in samplers
                    ),
                    flush=True,
                )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--backends", nargs="+", default=["torch", "cpp"], choices=["torch", "cpp"])
    ap.add_argument("--isas", nargs="+", default=[], choices=list(ISAS), help="C++ paths to measure")
    ap.add_argument("--baseline", type=Path, help="another sampling.cpp to measure beside this one")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the bench's default is 2)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--logit-std", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/sampler.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    report = measured(
        lambda: measure(args),
        vocab=VOCAB,
        temperature=TEMPERATURE,
        logit_std=args.logit_std,
        threads=args.threads,
        repeats=args.repeats,
        cpu=cpu_model(),
        isas=args.isas,
        baseline=str(args.baseline) if args.baseline else None,
    )
    write_report(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
