"""A layer's attention rules (a sliding window, a logit softcap) in the torch backend, against the dense
reference (kernels/paged_reference.py), which applies them as Hugging Face's eager attention does.

The torch backend is the oracle the C++ kernel's tests (test_cpp_backend.py, every ISA path) hold it to,
so here it is held to the reference: decode rows (padded, bucketed), prefill rows and continued chunks,
windows shorter than a block, longer than the context and odd in between, with and without a softcap.
"""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.attention import CAUSAL, AttentionRules
from pagedserve.kernels.paged_reference import make_paged_batch, reference_attention
from pagedserve.kernels.torch_backend import TorchAttentionBackend

# Decode rows of mixed lengths, a whole prefill, continued chunks (one starting inside a window).
STEP = {"seq_lens": [1, 9, 40, 77, 130, 60, 25], "query_lens": [1, 1, 1, 1, 130, 17, 25]}
# Enough decode rows that the backend splits them into length buckets.
MANY_DECODES = {"seq_lens": [5 + 7 * i for i in range(50)], "query_lens": [1] * 50}

RULES = [
    AttentionRules(window=1),
    AttentionRules(window=7),
    AttentionRules(window=13),
    AttentionRules(window=33, softcap=5.0),
    AttentionRules(window=500),
    AttentionRules(softcap=0.7),
    AttentionRules(softcap=50.0),
]


@pytest.mark.parametrize("rules", RULES, ids=str)
@pytest.mark.parametrize("step", [STEP, MANY_DECODES], ids=["mixed", "many-decodes"])
@pytest.mark.parametrize("block_size", [8, 16])
def test_torch_backend_applies_the_rules_like_the_reference(rules, step, block_size):
    batch = make_paged_batch(
        **step,
        num_heads=6,
        num_kv_heads=2,
        head_dim=24,
        block_size=block_size,
        dtype=torch.float32,
        device=torch.device("cpu"),
        seed=5,
    )
    scale = 24**-0.5
    got = TorchAttentionBackend().forward(
        batch.query, batch.k_cache, batch.v_cache, batch.metadata(), scale, rules
    )
    torch.testing.assert_close(got, reference_attention(batch, scale, rules), atol=2e-5, rtol=2e-5)


def test_a_window_changes_the_result_once_the_context_is_longer():
    """The rules are not a no-op: a window shorter than the context gives other outputs than none."""
    batch = make_paged_batch([40], [40], 4, 2, 16, 8, torch.float32, torch.device("cpu"), seed=1)
    backend = TorchAttentionBackend()
    full = backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata(), 0.25)
    windowed = backend.forward(
        batch.query, batch.k_cache, batch.v_cache, batch.metadata(), 0.25, AttentionRules(window=11)
    )
    assert torch.equal(full[:11], windowed[:11])  # positions 0..10 see their whole context either way
    assert not torch.allclose(full[11:], windowed[11:])


@pytest.mark.parametrize(("window", "softcap"), [(0, None), (-3, None), (None, 0.0), (None, -1.0)])
def test_rules_out_of_range_are_refused(window, softcap):
    with pytest.raises(ValueError, match="window|softcap"):
        AttentionRules(window, softcap)


def test_causal_is_the_default():
    assert AttentionRules() == CAUSAL and CAUSAL.first_visible(100) == 0
    assert AttentionRules(window=10).first_visible(100) == 91
