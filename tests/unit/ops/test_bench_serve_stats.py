"""The arrivals and the summaries of `pagedserve bench serve`."""

from __future__ import annotations

import math

import pytest

from pagedserve.ops.bench.serve import parse_args, rate_workloads, workload
from pagedserve.ops.bench.serve_load import RequestRecord, arrival_gaps
from pagedserve.ops.bench.serve_stats import summarize


def test_poisson_gaps_average_one_over_the_rate_and_repeat_for_a_seed():
    gaps = arrival_gaps(4000, 4.0, seed=1)
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.05)
    assert gaps == arrival_gaps(4000, 4.0, seed=1)
    assert arrival_gaps(3, math.inf, seed=1) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="request_rate"):
        arrival_gaps(3, 0.0, seed=1)


def test_summary_counts_tokens_and_times_per_request():
    good = RequestRecord(10, 4, ok=True, ttft_s=0.1, e2e_s=0.4, itl_s=[0.1, 0.1, 0.1], output_tokens=4)
    bad = RequestRecord(10, 4, error="HTTP 503: nope")
    run = summarize([good, bad], duration_s=2.0)
    assert (run["completed"], run["failed"], run["errors"]) == (1, 1, ["HTTP 503: nope"])
    assert run["total_output_tokens"] == 4 and run["output_throughput"] == 2.0
    assert run["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert run["tpot_ms"]["mean"] == pytest.approx(100.0)  # (0.4 - 0.1) / 3
    assert run["itl_ms"]["p99"] == pytest.approx(100.0)


def test_request_rates_parse_as_a_list_with_inf():
    assert parse_args(["--request-rate", "1,4,inf"]).request_rate == [1.0, 4.0, math.inf]
    with pytest.raises(SystemExit):
        parse_args(["--request-rate", "0"])


@pytest.mark.parametrize("kind", ["bench", "random"])
def test_every_rate_gets_fresh_prompts_and_reruns_get_the_same(kind):
    # One prompt set for all rates would let a prefix cache serve rate 4's prompts from rate 1's KV.
    args = parse_args(["--request-rate", "1,4,inf", "--workload", kind, "--num-prompts", "8", "--seed", "3"])
    workloads = rate_workloads(args, vocab_size=1000)
    assert len(workloads) == 3
    firsts = [tuple(prompts[0]) for prompts, _ in workloads]
    assert len(set(firsts)) == 3, "two rates share a prompt"
    assert all(len(prompts) == len(lens) == 8 for prompts, lens in workloads)
    assert workloads == rate_workloads(args, vocab_size=1000)
    assert workloads[1] == workload(args, 1000, seed=4)
