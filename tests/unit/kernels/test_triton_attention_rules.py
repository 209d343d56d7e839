"""The Triton kernels under a layer's rules (a sliding window, a logit softcap) match the dense reference.

Decode (split-KV, whose partitions then cover only the window, and one pass) and prefill / extend (a
whole prompt, a later chunk that starts inside a window, a short extend after a hit), a window shorter
than a block and an odd one, with and without a softcap; the backend's routing of a mixed step in
float32 and bfloat16. Few cases: the interpreter runs these at about a second each.
"""

from __future__ import annotations

import pytest
import torch
import triton_env  # noqa: F401  (before any kernels import: selects the Triton interpreter)
from triton_env import DEVICE
from triton_kernels import run_decode, run_prefill

from pagedserve.kernels.attention import AttentionRules
from pagedserve.kernels.paged_reference import TOLERANCES, make_paged_batch, reference_attention
from pagedserve.kernels.triton.backend import TritonAttentionBackend

RULES = [
    AttentionRules(window=5),
    AttentionRules(window=37, softcap=3.0),
    AttentionRules(softcap=0.9),
]


def _batch(seq_lens, query_lens, dtype=torch.float32, block_size=16, seed=11):
    return make_paged_batch(seq_lens, query_lens, 6, 2, 64, block_size, dtype, DEVICE, seed)


@pytest.mark.parametrize(("rules", "num_splits"), [(r, 3) for r in RULES] + [(RULES[1], 1)], ids=str)
def test_decode_applies_the_rules(rules, num_splits):
    batch = _batch([3, 40, 130, 290], [1, 1, 1, 1])
    out = run_decode(batch, 0.125, num_splits=num_splits, block_n=16, rules=rules)
    torch.testing.assert_close(out.cpu(), reference_attention(batch, 0.125, rules), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("rules", RULES, ids=str)
def test_prefill_applies_the_rules(rules):
    batch = _batch([70, 100, 60], [70, 30, 2])
    out = run_prefill(batch, 0.125, block_m=16, block_n=16, rules=rules)
    torch.testing.assert_close(out.cpu(), reference_attention(batch, 0.125, rules), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_backend_routes_a_mixed_step_under_the_rules(dtype):
    rules = AttentionRules(window=21, softcap=4.0)
    batch = _batch([9, 70, 44, 120], [1, 1, 44, 25], dtype=dtype, block_size=8, seed=3)
    backend = TritonAttentionBackend()
    got = backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata(), 0.125, rules)
    atol, rtol = TOLERANCES[dtype]
    expected = reference_attention(batch, 0.125, rules)
    torch.testing.assert_close(got.float().cpu(), expected, atol=atol, rtol=rtol)
