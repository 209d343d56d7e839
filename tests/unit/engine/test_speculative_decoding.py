"""Speculative decoding through the in-process engine: the tokens never change, only the steps they take.

Random tiny models rarely continue a repetition, so most tests use an oracle proposer that proposes
the reference output with a wrong token every few calls: each run then has accepted and rejected
proposals at every offset. The real proposers (prompt lookup, suffix) run on prompts that repeat.
"""

from __future__ import annotations

import random

import pytest
import torch
from harness.tiny_models import VOCAB_SIZE

from pagedserve import LLM, SamplingParams
from pagedserve.shared.protocol.constraints import StructuredOutputs

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "max_step_rows": 64, "row_cost": 0.0}


class OracleProposer:
    """Proposes the reference continuation of each prompt; every `wrong_every`-th call one token is off."""

    name = "oracle"

    def __init__(self, answers: dict[tuple[int, ...], list[int]], wrong_every: int = 3) -> None:
        self.answers = answers
        self.wrong_every = wrong_every
        self.calls = 0

    def propose(self, state, k: int) -> list[int]:
        self.calls += 1
        done = len(state.output_token_ids)
        proposal = list(self.answers.get(tuple(state.prompt_token_ids), [])[done : done + k])
        if self.wrong_every and proposal and self.calls % self.wrong_every == 0:
            j = self.calls % len(proposal)
            proposal[j] = 3 + (proposal[j] + 1) % 250
        return proposal

    def finished(self, state) -> None:
        pass


def prompts(count: int = 8, seed: int = 0, repeat: bool = False) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for n in (5, 17, 40, 64, 3, 90, 33, 8)[:count]:
        base = [rng.randrange(3, 250) for _ in range(n)]
        out.append(base + base[: n // 2] if repeat else base)
    return out


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return str(tiny_model("llama"))


def run(model_path, batch, params, spec=None, oracle_from=None, **engine):
    llm = LLM(model_path, **{"num_blocks": 256, "block_size": 16, **engine}, speculative_config=spec)
    if oracle_from is not None:
        llm.runner.proposer = OracleProposer(
            {tuple(p): o.token_ids for p, o in zip(batch, oracle_from, strict=True)}
        )
    return llm, llm.generate(batch, params)


def assert_pool_whole(llm: LLM) -> None:
    snap = llm.block_manager.snapshot(0.0)
    assert snap["totals"]["free"] == snap["totals"]["total"], snap["totals"]
    assert snap["invariants"]["ok"], snap["invariants"]


GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
SAMPLED = SamplingParams(
    temperature=1.0,
    top_k=50,
    top_p=0.9,
    min_p=0.01,
    repetition_penalty=1.2,
    presence_penalty=0.3,
    frequency_penalty=0.2,
    seed=7,
    max_tokens=24,
    ignore_eos=True,
    logprobs=2,
)


@pytest.fixture(scope="module")
def references(model_path):
    return {
        name: run(model_path, prompts(), params)[1]
        for name, params in (("greedy", GREEDY), ("sampled", SAMPLED))
    }


@pytest.fixture(scope="module")
def steps_without(model_path):
    """Steps an engine setting takes without speculation (greedy), measured once per setting."""
    steps: dict[str, int] = {}

    def of(engine: dict) -> int:
        key = repr(sorted(engine.items()))
        if key not in steps:
            steps[key] = run(model_path, prompts(), GREEDY, **engine)[0].scheduler.stats.steps
        return steps[key]

    return of


@pytest.mark.parametrize(
    "engine",
    [
        {"pipeline_depth": 1, "num_blocks": 24, "block_size": 8, "max_num_seqs": 8},
        {"pipeline_depth": 2, "max_num_batched_tokens": 32},
        {"pipeline_depth": 3},
        {"pipeline_depth": 2, "num_blocks": 24, "block_size": 8, "max_num_seqs": 8},
    ],
    ids=["depth1-preempting", "depth2-chunked", "depth3", "depth2-preempting"],
)
@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_tokens_and_logprobs_are_those_of_decoding_without_speculation(
    model_path, references, steps_without, kind, engine
):
    reference = references[kind]
    params = GREEDY if kind == "greedy" else SAMPLED
    llm, got = run(model_path, prompts(), params, SPEC, oracle_from=reference, **engine)
    assert [o.token_ids for o in got] == [o.token_ids for o in reference]
    if kind == "sampled":
        for ours, theirs in zip(got, reference, strict=True):
            assert len(ours.outputs[0].logprobs) == len(ours.token_ids)
            for a, b in zip(ours.outputs[0].logprobs, theirs.outputs[0].logprobs, strict=True):
                assert a[0] == pytest.approx(b[0], abs=1e-4)
                assert [t for t, _ in a[1]] == [t for t, _ in b[1]]
    stats = llm.scheduler.stats
    assert 0 < stats.spec_accepted < stats.spec_proposed, "both accepted and rejected proposals"
    if kind == "greedy":
        assert stats.steps < steps_without(engine), "accepted proposals save steps"
    if engine.get("num_blocks") == 24:
        assert stats.preemptions > 0, "the pool was meant to be too small for everyone at once"
    assert_pool_whole(llm)


def test_rejected_slots_are_reused_so_tables_hold_at_most_the_lookahead_in_flight(model_path, references):
    """Every step, each table holds no more blocks than its known tokens plus L slots per step in flight
    need: the slots of rejected proposals are written again, not left behind."""
    llm = LLM(model_path, num_blocks=256, block_size=8, pipeline_depth=2, speculative_config=SPEC)
    batch = prompts()
    llm.runner.proposer = OracleProposer(
        {tuple(p): o.token_ids for p, o in zip(batch, references["greedy"], strict=True)}, wrong_every=2
    )
    excess: list[int] = []
    engine_step = llm.engine.step

    def watching_step():
        events = engine_step()
        for req in llm.scheduler.live_requests():
            table = llm.block_manager.table(req.request_id)
            if table is not None:
                allowed = -(-(req.num_known + 1 + 4 * 2) // 8)  # + one decode and L=4 for each of 2 steps
                excess.append(len(table) - allowed)
        return events

    llm.engine.step = watching_step
    got = llm.generate(batch, GREEDY)
    assert [o.token_ids for o in got] == [o.token_ids for o in references["greedy"]]
    assert excess and max(excess) <= 0, max(excess)
    stats = llm.scheduler.stats
    assert stats.spec_proposed - stats.spec_accepted > 20, "many rejected proposals"
    assert_pool_whole(llm)


@pytest.mark.parametrize("method", ["ngram", "suffix"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_real_proposers_keep_greedy_output(tiny_model, method, arch):
    path = str(tiny_model(arch))
    batch = prompts(repeat=True)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    _, reference = run(path, batch, params)
    # Twice on one engine: the suffix index has the first round's outputs for the second.
    llm = LLM(path, num_blocks=256, block_size=16, speculative_config={**SPEC, "method": method})
    for _ in range(2):
        got = llm.generate(batch, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in reference]
    assert llm.scheduler.stats.spec_proposed > 0
    if method == "suffix":
        assert llm.scheduler.stats.spec_accepted > 0, "the second round repeats the first's outputs"
    assert_pool_whole(llm)


def test_prefix_cache_holds_only_accepted_tokens(model_path):
    """Blocks written by speculating requests are hit by later prompts and give the same tokens."""
    system = list(range(10, 74))  # 4 full blocks of 16
    first = [system + [100 + i, 101, 102] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    _, cold_first = run(model_path, first, params, enable_prefix_caching=False)
    # The second round's prompts continue the first round's outputs: their blocks were written while
    # proposals were being accepted and rejected.
    second = [p + o.token_ids + [7] for p, o in zip(first, cold_first, strict=True)]
    _, cold_second = run(model_path, second, params, enable_prefix_caching=False)
    llm = LLM(model_path, num_blocks=256, block_size=16, speculative_config=SPEC)
    llm.runner.proposer = OracleProposer(
        {tuple(p): o.token_ids for p, o in zip(first + second, cold_first + cold_second, strict=True)}
    )
    got_first = llm.generate(first, params)
    got_second = llm.generate(second, params)
    assert [o.token_ids for o in got_first + got_second] == [o.token_ids for o in cold_first + cold_second]
    # Each second prompt hits the blocks its first prompt + output filled (64 + 3 + 30 = 97 tokens).
    assert [o.num_cached_tokens for o in got_second] == [96] * 4
    assert_pool_whole(llm)


def test_stop_string_inside_accepted_proposals_cuts_the_text_as_without(model_path):
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    _, free = run(model_path, ["hello world"], params)
    stop = free[0].text[6:8]
    stopped = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=[stop])
    _, reference = run(model_path, ["hello world"], stopped)
    llm = LLM(model_path, num_blocks=64, block_size=16, speculative_config=SPEC)
    prompt_ids = llm.encode("hello world")
    llm.runner.proposer = OracleProposer({tuple(prompt_ids): free[0].token_ids}, wrong_every=0)
    got = llm.generate(["hello world"], stopped)
    assert got[0].finish_reason == reference[0].finish_reason == "stop"
    assert got[0].text == reference[0].text
    assert llm.scheduler.stats.spec_accepted > 0
    assert_pool_whole(llm)


class GrammarValidOracle(OracleProposer):
    """Wrong proposals the grammar allows (a digit for the next digit, `c` for `a` and back): rejected by
    the target's own token, not by the mask, so the matcher must roll them back."""

    def __init__(self, answers: dict[tuple[int, ...], list[int]], swap: dict[int, int]) -> None:
        super().__init__(answers)
        self.swap = swap

    def propose(self, state, k: int) -> list[int]:
        self.calls += 1
        done = len(state.output_token_ids)
        proposal = list(self.answers.get(tuple(state.prompt_token_ids), [])[done : done + k])
        if self.calls % 2 == 0:
            for j, token in enumerate(proposal):  # the first token that has a grammar-valid stand-in
                if token in self.swap:
                    proposal[j] = self.swap[token]
                    break
        return proposal


def test_grammar_checks_proposals_and_rolls_back_rejected_ones(model_path):
    spec = StructuredOutputs(regex="(ab|c)+[0-9]{2,5}")
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=30, structured_outputs=spec)
    batch = prompts(4)
    _, reference = run(model_path, batch, params)
    llm = LLM(model_path, num_blocks=256, block_size=16, speculative_config=SPEC)
    chars = "0123456789ac"
    ids = {c: llm.tokenizer.encode(c) for c in chars}
    assert all(len(v) == 1 for v in ids.values()), ids
    stand_in = {c: str((int(c) + 1) % 10) if c.isdigit() else "ca"["ac".index(c)] for c in chars}
    swap = {ids[c][0]: ids[stand_in[c]][0] for c in chars}
    llm.runner.proposer = GrammarValidOracle(
        {tuple(p): o.token_ids for p, o in zip(batch, reference, strict=True)}, swap
    )
    got = llm.generate(batch, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in reference]
    assert 0 < llm.scheduler.stats.spec_accepted < llm.scheduler.stats.spec_proposed
    assert_pool_whole(llm)


def test_a_request_can_turn_speculation_off(model_path):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, speculate=False)
    _, reference = run(model_path, prompts(3), params)
    llm, got = run(model_path, prompts(3), params, SPEC, oracle_from=reference)
    assert [o.token_ids for o in got] == [o.token_ids for o in reference]
    assert llm.scheduler.stats.spec_proposed == 0


def chi_square_p_value(observed: list[int], expected: list[float]) -> float:
    """Pearson's chi-square test: P(X >= statistic) for X ~ chi2(len - 1)."""
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    dof = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(statistic / 2.0)))


def chi_square_fits(tokens: list[int], probs: torch.Tensor) -> tuple[float, list[int], list[float]]:
    """Pearson's chi-square of `tokens` against `probs`, over the tokens expected >= 5 times (the rest
    pooled into one bin): the p-value, observed and expected counts."""
    total = len(tokens)
    expected = (probs * total).tolist()
    kept = [t for t in range(len(expected)) if expected[t] >= 5]
    observed = [tokens.count(t) for t in kept]
    want = [expected[t] for t in kept]
    rest = total - sum(want)
    if rest >= 5:
        observed.append(total - sum(observed))
        want.append(rest)
    return chi_square_p_value(observed, want), observed, want


@pytest.mark.parametrize("temperature", [0.3, 3.0], ids=["peaked", "flat"])
def test_rejection_sampling_keeps_the_target_distribution(model_path, temperature):
    """4,000 seeded decodes of one context, each with the target's most likely token proposed: the
    step's first token must follow the model's distribution at that position (the proposal kept with
    probability p(d), else a token drawn from the rest), and the token after an accepted proposal the
    distribution at the next one. Pearson's chi-square over the tokens expected >= 5 times (the rest
    pooled), rejecting at p < 0.001 (with fixed seeds the verdict is the same every run).
    """
    from pagedserve.services.worker.runner import ModelRunner
    from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest, WorkerSampling

    samples, context = 4000, prompts(1)[0][:8]
    runner = ModelRunner(model_path, block_size=16, num_blocks=samples, speculative_config=None)
    news = [
        NewRequest(
            f"r{i}",
            context,
            len(context) - 1,  # the last context token is "output": the decode below computes it
            0,
            len(context) - 1,
            [i],
            WorkerSampling.of(SamplingParams(temperature=temperature, seed=i), i),
        )
        for i in range(samples)
    ]
    runner.execute(Execute(0, news))  # the context but its last token: nothing sampled
    greedy = ModelRunner(model_path, block_size=16, num_blocks=4, speculative_config=None)
    greedy.execute(
        Execute(0, [NewRequest("g", context, len(context) - 1, 0, len(context) - 1, [0], news[0].sampling)])
    )
    _, logits = greedy.execute_with_logits(Execute(1, cached_requests=[CachedRequest("g", 1)]))
    p0 = torch.softmax(logits[0, :VOCAB_SIZE].float() / temperature, dim=0)
    proposal = int(p0.argmax())
    runner.proposer = _Fixed(proposal)
    result, logits = runner.execute_with_logits(
        Execute(1, cached_requests=[CachedRequest(f"r{i}", 1, num_lookahead=1) for i in range(samples)])
    )
    p1 = torch.softmax(logits[1, :VOCAB_SIZE].float() / temperature, dim=0)  # after the proposal
    assert torch.allclose(logits[0], logits[2 * (samples - 1)], atol=1e-5)  # one context, every row
    firsts = result.token_ids
    seconds = [s.more_token_ids[0] for s in result.speculation if s.more_token_ids]
    assert len(result.speculation) == samples
    assert len(seconds) == firsts.count(proposal)
    p_first, observed, want = chi_square_fits(firsts, p0)
    assert p_first > 1e-3, (observed, want)
    if len(seconds) >= 200:
        p_second, observed, want = chi_square_fits(seconds, p1)
        assert p_second > 1e-3, (observed, want)


class _Fixed:
    """Proposes one fixed token (a one-hot q)."""

    name = "fixed"

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, state, k: int) -> list[int]:
        return [self.token]

    def finished(self, state) -> None:
        pass


def test_a_null_row_cost_has_the_engine_price_rows_from_its_own_steps(model_path):
    """`row_cost: null`: the scheduler fits what a row adds to a step from the worker's decode steps
    (row_cost.py), here steps of one request scoring 1 to 5 rows, and the tokens are still the greedy ones."""
    batch = prompts(2, repeat=True)[:1]
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "max_step_rows": 64}
    spec["row_cost"] = None
    llm, outputs = run(model_path, batch, GREEDY, spec=spec)
    _, reference = run(model_path, batch, GREEDY)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in reference]
    learned = llm.scheduler.speculation.learned
    assert llm.scheduler.stats.spec_proposed > 0
    assert len(learned.means) >= 2 and all(t > 0 for t in learned.means.values()), learned.means
    assert max(learned.means) <= 5  # one decode and at most 4 proposals a step
    assert llm.scheduler.speculation.row_cost == learned.value
