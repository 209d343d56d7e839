"""Summaries of one `bench serve` run, with the names `vllm bench serve` uses: throughput, and
mean / median (p50) / p90 / p99 of TTFT, TPOT, ITL and end-to-end latency, in milliseconds."""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedserve.ops.bench.serve_load import RequestRecord

PERCENTILES = (50, 90, 99)


def distribution_ms(values_s: list[float]) -> dict[str, float | None]:
    if not values_s:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    ms = np.asarray(values_s) * 1000.0
    return {
        "mean": round(float(ms.mean()), 2),
        **{f"p{p}": round(float(np.percentile(ms, p)), 2) for p in PERCENTILES},
    }


def summarize(records: list[RequestRecord], duration_s: float) -> dict[str, Any]:
    done = [r for r in records if r.ok]
    output = sum(r.output_tokens for r in done)
    return {
        "completed": len(done),
        "failed": len(records) - len(done),
        "errors": sorted({r.error for r in records if r.error})[:5],
        "duration_s": round(duration_s, 3),
        "total_input_tokens": sum(r.prompt_tokens for r in done),
        "total_output_tokens": output,
        "request_throughput": round(len(done) / duration_s, 3) if duration_s > 0 else None,
        "output_throughput": round(output / duration_s, 2) if duration_s > 0 else None,
        "ttft_ms": distribution_ms([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot_ms": distribution_ms([t for r in done if (t := r.tpot_s) is not None]),
        "itl_ms": distribution_ms([gap for r in done for gap in r.itl_s]),
        "e2e_ms": distribution_ms([r.e2e_s for r in done if r.e2e_s is not None]),
    }
