"""Micro-benchmark of the wire codec on one engine step's hot messages (pure Python, one process).

    python -m pagedserve.ops.microbench.codec [--rows 64] [--repeat 7] [--out bench/results/codec.json]

One decode step of `--rows` requests crosses four frames: the scheduler's `Execute` (every row a
cached request, one token each, one in eight with a new block), the worker's `StepResult`, and the
block-manager batch of `grow` ops with its reply. Each is timed as encode (declared message ->
bytes) and decode (bytes -> declared message) two ways:

- `codec`: the codec as it stands (shared/protocol: `encode_message`, `decode` + `read_message`).
  every internal message is a msgspec Struct whose msgpack is the `body` of the frame's map (up to
  commit db67631 every type had a hand-written codec over msgpack, and the block frames kept theirs
  until the wave's typed block ops);
- `msgspec`: every frame as one `msgspec.Struct(array_like=True)` tagged by `type`, encoded and
  decoded by msgspec.msgpack in one pass (what a codec with no map envelope at all would cost).

Times are the best of `--repeat` runs of many calls (perf_counter, microseconds per call), so a
busy machine inflates them less; still, name the CPU and the load beside any number you quote.
"""

from __future__ import annotations

import argparse
import os
import platform
import timeit
from collections.abc import Callable
from typing import Any, Union

import msgspec

from pagedserve.kernels.cpu.isa import cpu_model
from pagedserve.ops.results import write_json
from pagedserve.shared.protocol.blocks import BlockBatch, BlockOp, BlockReply, BlockResult, Grow, Growth
from pagedserve.shared.protocol.codec import decode
from pagedserve.shared.protocol.messages import encode_message, read_message
from pagedserve.shared.protocol.step import (
    CachedRequest,
    Execute,
    ExecuteMessage,
    StepResult,
    StepResultMessage,
)

# ---------------------------------------------------------------- today's messages


def declared_messages(rows: int) -> dict[str, Any]:
    cached = [CachedRequest(f"req-{i:06d}", 1, [1000 + i] if i % 8 == 0 else [], []) for i in range(rows)]
    ids = [c.request_id for c in cached]
    grow_results: list[BlockResult] = [Growth((1000 + i,)) if i % 8 == 0 else Growth() for i in range(rows)]
    return {
        "execute": ExecuteMessage(Execute(step=4242, cached_requests=cached, finished_ids=["req-done"])),
        "step_result": StepResultMessage(
            "worker-0",
            StepResult(
                4242, ids, [17 + i for i in range(rows)], None, {"forward_s": 0.02, "sample_s": 0.001}
            ),
            generation=3,
        ),
        "block_ops": BlockBatch(77, [Grow(rid, 1, [17]) for rid in ids]),
        "block_reply": BlockReply(77, grow_results, {"worker-0": 4000}, "bm-1a2b3c"),
    }


# ---------------------------------------------------------------- the same as msgspec Structs


class _Frame(msgspec.Struct, array_like=True, tag_field="type", omit_defaults=False):
    v: int = 1


class MCachedRequest(msgspec.Struct, array_like=True):
    request_id: str
    num_scheduled_tokens: int
    new_block_ids: list[int] = []
    replaced_blocks: list[tuple[int, int]] = []


class MNewRequest(msgspec.Struct, array_like=True):
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int
    num_scheduled_tokens: int
    block_ids: list[int]
    sampling: dict[str, Any]


class MFork(msgspec.Struct, array_like=True):
    parent_id: str
    child_id: str
    seed: int | None


class MExecute(_Frame, tag="execute"):
    step: int = 0
    new_requests: list[MNewRequest] = []
    cached_requests: list[MCachedRequest] = []
    finished_ids: list[str] = []
    copies: list[tuple[int, int]] = []
    forks: list[MFork] = []


class MStepResult(_Frame, tag="step_result"):
    worker_id: str = ""
    step: int = 0
    request_ids: list[str] = []
    token_ids: list[int] = []
    logprobs: list[Any] | None = None
    timings: dict[str, float] = {}
    generation: int = 0


class MBlockBatch(_Frame, tag="block_ops"):
    seq: int = 0
    ops: list[BlockOp] = []


class MBlockReply(_Frame, tag="block_reply"):
    seq: int = 0
    results: list[BlockResult] = []
    free_blocks: dict[str, int] = {}
    instance: str = ""


MSGSPEC_TYPES = Union[MExecute, MStepResult, MBlockBatch, MBlockReply]  # noqa: UP007 (msgspec wants a Union)


def msgspec_messages(declared: dict[str, Any]) -> dict[str, Any]:
    ex = declared["execute"].execute
    sr = declared["step_result"]
    return {
        "execute": MExecute(
            step=ex.step,
            cached_requests=[
                MCachedRequest(c.request_id, c.num_scheduled_tokens, c.new_block_ids, c.replaced_blocks)
                for c in ex.cached_requests
            ],
            finished_ids=ex.finished_ids,
        ),
        "step_result": MStepResult(
            worker_id=sr.worker_id,
            step=sr.result.step,
            request_ids=sr.result.request_ids,
            token_ids=sr.result.token_ids,
            timings=sr.result.timings,
            generation=sr.generation,
        ),
        "block_ops": MBlockBatch(seq=declared["block_ops"].seq, ops=declared["block_ops"].ops),
        "block_reply": MBlockReply(
            seq=declared["block_reply"].seq,
            results=declared["block_reply"].results,
            free_blocks=declared["block_reply"].free_blocks,
            instance=declared["block_reply"].instance,
        ),
    }


# ---------------------------------------------------------------- timing


def best_us(call: Callable[[], Any], repeat: int) -> float:
    number = 200
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6


def bench(rows: int, repeat: int) -> dict[str, Any]:
    declared = declared_messages(rows)
    fast = msgspec_messages(declared)
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(MSGSPEC_TYPES)
    out: dict[str, Any] = {}
    for name in declared:
        frame = encode_message(declared[name])
        fast_frame = encoder.encode(fast[name])
        if decoder.decode(fast_frame) != fast[name]:
            raise RuntimeError(f"msgspec round trip changed {name}")
        if read_message(decode(frame)) != declared[name]:
            raise RuntimeError(f"codec round trip changed the type of {name}")
        out[name] = {
            "codec": {
                "bytes": len(frame),
                "encode_us": best_us(lambda m=declared[name]: encode_message(m), repeat),
                "decode_us": best_us(lambda f=frame: read_message(decode(f)), repeat),
            },
            "msgspec": {
                "bytes": len(fast_frame),
                "encode_us": best_us(lambda m=fast[name]: encoder.encode(m), repeat),
                "decode_us": best_us(lambda f=fast_frame: decoder.decode(f), repeat),
            },
        }
    for way in ("codec", "msgspec"):
        out.setdefault("per_step_us", {})[way] = round(
            sum(out[n][way]["encode_us"] + out[n][way]["decode_us"] for n in declared), 1
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", default=None, help="write the numbers as JSON here too")
    args = parser.parse_args(argv)
    results = bench(args.rows, args.repeat)
    print(f"codec per step, {args.rows} decode rows; CPU: {cpu_model()}; load {os.getloadavg()[0]:.1f}")
    print(f"{'message':<12} {'way':<8} {'bytes':>7} {'encode us':>10} {'decode us':>10}")
    for name, ways in results.items():
        if name == "per_step_us":
            continue
        for way, r in ways.items():
            print(f"{name:<12} {way:<8} {r['bytes']:>7} {r['encode_us']:>10.1f} {r['decode_us']:>10.1f}")
    per_step = results["per_step_us"]
    print(
        f"per step (4 frames, encode + decode): codec {per_step['codec']} us, msgspec {per_step['msgspec']} us"
    )
    if args.out:
        write_json(
            args.out,
            {
                "bench": "codec",
                "rows": args.rows,
                "cpu": cpu_model(),
                "python": platform.python_version(),
                "msgspec": msgspec.__version__,
                "load_1m": os.getloadavg()[0],
                "results": results,
            },
        )


if __name__ == "__main__":
    main()
