"""What a decode step costs as it gains rows: B requests, each scoring 1 + k positions (k proposals).

    python -m pagedserve.ops.microbench.spec_rows --requests 1,4,16 --proposals 0,1,3,5,7

Where the time per step stops being flat is where proposals stop being nearly free: the speculative
config's `max_step_rows` (docs/speculative-decoding.md). Runs the model runner directly (no scheduler),
one context of --context tokens per request, proposals that are always rejected (every step scores the
same positions again), median of --steps steps after warm-up. Prints one JSON line per cell.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from pagedserve.shared.config import add_config_flag


class _Constant:
    name = "constant"

    def __init__(self, k: int) -> None:
        self.k = k

    def propose(self, state, k: int) -> list[int]:
        return [7] * min(k, self.k)

    def finished(self, state) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    add_config_flag(ap, "model")
    add_config_flag(ap, "quantization", "auto")
    ap.add_argument("--requests", default="1,4,16")
    ap.add_argument("--proposals", default="0,1,3,5,7")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    import torch

    from pagedserve.kernels.cpu.isa import cpu_model
    from pagedserve.services.checkpoint import load_checkpoint
    from pagedserve.services.worker.runner import ModelRunner
    from pagedserve.shared.protocol.frontend import SamplingParams
    from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest, WorkerSampling

    torch.set_num_threads(args.threads)
    path = load_checkpoint(args.model).path
    max_requests = max(int(r) for r in args.requests.split(","))
    blocks_each = (args.context + 16 + 15) // 16
    runner = ModelRunner(
        path, block_size=16, num_blocks=max_requests * blocks_each, quantization=args.quantization
    )
    sampling = WorkerSampling.of(SamplingParams(temperature=0.0), None)
    for b in [int(r) for r in args.requests.split(",")]:
        for k in [int(p) for p in args.proposals.split(",")]:
            runner.requests.clear()
            news = [
                NewRequest(
                    f"r{i}",
                    [11 + (i + j) % 1000 for j in range(args.context)],
                    args.context - 1,
                    0,
                    args.context - 1,
                    list(range(i * blocks_each, (i + 1) * blocks_each)),
                    sampling,
                )
                for i in range(b)
            ]
            runner.execute(Execute(0, news))
            runner.proposer = _Constant(k)
            times = []
            for step in range(args.steps + 3):
                for state in runner.requests.values():  # score the same positions every step
                    state.num_computed_tokens = args.context - 1
                    del state.output_token_ids[:]
                    state.prompt_token_ids = state.prompt_token_ids[: args.context - 1] + [
                        state.prompt_token_ids[-1]
                    ]
                cached = [CachedRequest(f"r{i}", 1, num_lookahead=k) for i in range(b)]
                started = time.perf_counter()
                runner.execute(Execute(step + 1, cached_requests=cached))
                if step >= 3:
                    times.append(time.perf_counter() - started)
            print(
                json.dumps(
                    {
                        "cpu": cpu_model(),
                        "requests": b,
                        "proposals": k,
                        "rows": b * (1 + k),
                        "step_ms": round(1e3 * statistics.median(times), 2),
                        "weights": runner.runtime.get("weights"),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
