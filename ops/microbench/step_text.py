"""Micro-benchmark: what making text costs the scheduler's thread per step result.

    python -m pagedserve.ops.microbench.step_text [--rows 64] [--steps 300] [--out bench/results/step-text.json]

`rows` requests decode one token per step on one worker; timed is `on_step_result` (append the
tokens, check stops, make each completion's new text): without a tokenizer (the simulated fleet's
case), with the bundled model's tokenizer called as `tokenizer.decode`, with the decoder the scheduler
uses (shared/completion_text.py: the Rust tokenizer itself where that is the same text), that also
with two stop strings, and for requests whose client makes the text (Submit.detokenize false, as the
API's are): the scheduler then decodes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from pagedserve.ops.results import write_json
from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.services.scheduler.model_info import load_model_info
from pagedserve.services.scheduler.scheduler import Scheduler, SchedulerLimits
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import StepResult

W = "w0"


class _PlainDecode:
    """The tokenizer seen only through its Python `decode` (what the scheduler called before)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def step_result_ms(tokenizer: Any, rows: int, steps: int, stop: list[str], detokenize: bool = True) -> float:
    bm = BlockManager(lease_ttl_s=1e9)
    blocks = rows * (steps // 16 + 16)
    bm.add_pool(W, blocks, 16)
    limits = SchedulerLimits(
        max_num_seqs=rows, max_num_batched_tokens=1 << 16, pipeline_depth=1, max_model_len=1 << 16
    )
    sched = Scheduler(limits, eos_token_ids=[0], tokenizer=tokenizer)
    sched.add_worker(W, blocks, 16)
    params = SamplingParams(temperature=0.0, max_tokens=1 << 20, ignore_eos=True, stop=stop)
    for i in range(rows):
        sched.add_request(f"r{i}", list(range(100, 228)), params, 0.0, detokenize=detokenize)
    times = []
    for step in range(steps):
        plan = sched.schedule(W, 0.0)
        ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
        assert ex is not None
        ids = ex.request_ids()
        tokens = [300 + (step * 7 + j) % 5000 for j in range(len(ids))]  # words, not specials
        t = time.perf_counter()
        sched.on_step_result(W, StepResult(ex.step, ids, tokens), 0.0)
        times.append(time.perf_counter() - t)
    return statistics.median(times[steps // 5 :]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="bench/results/step-text.json")
    args = ap.parse_args()
    tokenizer = load_model_info("smollm2-135m").tokenizer
    cases = {
        "no_tokenizer": (None, [], True),
        "tokenizer_decode": (_PlainDecode(tokenizer), [], True),
        "rust_decoder": (tokenizer, [], True),
        "rust_decoder_two_stops": (tokenizer, ["\n\nUser:", "###"], True),
        "client_makes_text": (tokenizer, [], False),
    }
    result: dict[str, Any] = {"rows": args.rows, "steps": args.steps}
    for name, (tok, stop, detokenize) in cases.items():
        result[f"{name}_ms"] = round(step_result_ms(tok, args.rows, args.steps, stop, detokenize), 3)
        print(f"{name:>24}: {result[f'{name}_ms']:.3f} ms per {args.rows}-row step result")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(args.out), result)


if __name__ == "__main__":
    main()
