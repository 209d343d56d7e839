"""Judging what the clients of a chaos run got: streams against results, results against the reference.

- A stream is whole when its deltas, concatenated, are exactly the final tokens and text.
- An output is right when it equals the fault-free reference of the same prompt (greedy): its
  tokens, or for a request through the HTTP API (text only) its text.
- An error is excused only while no worker was ready: a request that failed while a worker could
  have served it is a failure of the deployment, whatever its code.
"""

from __future__ import annotations

from typing import Any

from pagedserve.ops.chaos.load import RequestRecord
from pagedserve.ops.chaos.watch import Sample


def judge_outputs(
    records: list[RequestRecord], reference: list[tuple[list[int], str] | None] | None, samples: list[Sample]
) -> dict[str, Any]:
    """`reference[i]` is the fault-free (tokens, text) of `records[i]`'s prompt (None: not computed)."""
    duplicated = missing = broken_streams = text_mismatch = 0
    wrong: list[str] = []
    unchecked = 0
    for i, rec in enumerate(records):
        if rec.final_text is None:
            continue
        dup, miss = rec.stream_errors()
        duplicated += dup
        missing += miss
        broken_streams += bool(dup or miss)
        text_mismatch += rec.streamed_text != rec.final_text
        ref = None if reference is None else reference[i]
        if ref is None:
            unchecked += 1
        elif (rec.final_tokens != ref[0]) if rec.final_tokens is not None else (rec.final_text != ref[1]):
            wrong.append(rec.request_id)
    errored_with_workers = [
        r.request_id for r in records if r.error is not None and _workers_ready_throughout(r, samples)
    ]
    return {
        "checked_against_reference": reference is not None,
        "compared": sum(r.final_text is not None for r in records) - unchecked,
        "compared_via_api": sum(r.final_text is not None and r.via == "api" for r in records),
        "unchecked": unchecked,
        "wrong": len(wrong),
        "wrong_ids": wrong[:50],
        "streams_broken": broken_streams,
        "duplicated_stream_tokens": duplicated,
        "missing_stream_tokens": missing,
        "stream_text_mismatch": text_mismatch,
        "errored_while_workers_ready": len(errored_with_workers),
        "errored_while_workers_ready_ids": errored_with_workers[:50],
    }


def _workers_ready_throughout(rec: RequestRecord, samples: list[Sample]) -> bool:
    """Every timeline sample during the request's life saw a ready worker (a sample with no answer
    from the scheduler counts as none ready: it was being restarted)."""
    end = rec.ended if rec.ended is not None else float("inf")
    during = [s for s in samples if rec.started <= s.t <= end]
    return bool(during) and all(s.ready for s in during)
