"""Configs as the Hub holds them (older spellings, fields left to their defaults) read as transformers
reads them: which layers slide and how far, and each layer's rotary frequencies, bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pagedserve.services.worker.layers.rope import RotaryEmbedding
from pagedserve.services.worker.models.registry import parse_config

SHAPE = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 32, "num_attention_heads": 4}


def _transformers(config_class: str, fields: dict[str, Any]) -> Any:
    import transformers

    return getattr(transformers, config_class)(**fields)


def _windows(hf_config: Any) -> tuple[int | None, ...]:
    window = hf_config.sliding_window
    return tuple(window if t == "sliding_attention" else None for t in hf_config.layer_types)


# Gemma 2 as published: no layer_types (every other layer slides), no rope_parameters.
GEMMA2 = {**SHAPE, "num_hidden_layers": 5, "head_dim": 16, "sliding_window": 4096, "rope_theta": 10000.0}
# Gemma 3 as published: sliding_window_pattern, rope_local_base_freq, a global rope_scaling.
GEMMA3 = {
    **SHAPE,
    "num_hidden_layers": 8,
    "head_dim": 16,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
}


def test_gemma2_without_layer_types_slides_every_other_layer():
    ours = parse_config({**GEMMA2, "architectures": ["Gemma2ForCausalLM"]})
    theirs = _transformers("Gemma2Config", GEMMA2)
    assert ours.layer_windows == _windows(theirs) == (4096, None, 4096, None, 4096)
    # Left out of the config, transformers' defaults hold.
    assert ours.attn_logit_softcap == theirs.attn_logit_softcapping == 50.0
    assert ours.final_logit_softcap == theirs.final_logit_softcapping == 30.0
    assert ours.scale == theirs.query_pre_attn_scalar**-0.5 and ours.tie_word_embeddings


def test_gemma3_with_the_old_fields_has_transformers_windows_and_rotaries():
    import transformers

    ours = parse_config({**GEMMA3, "architectures": ["Gemma3ForCausalLM"]})
    theirs = _transformers("Gemma3TextConfig", GEMMA3)
    assert ours.layer_windows == _windows(theirs)
    assert ours.layer_windows.count(None) == 1  # layer 5 of 8 is the only global one
    rotary = transformers.models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding(theirs)
    assert ours.sliding_rope is not None
    for rope, layer_type in ((ours.rope, "full_attention"), (ours.sliding_rope, "sliding_attention")):
        mine = RotaryEmbedding(rope, ours.head_dim, ours.max_position_embeddings)
        assert torch.equal(mine.inv_freq, getattr(rotary, f"{layer_type}_inv_freq"))
        assert mine.attention_factor == getattr(rotary, f"{layer_type}_attention_scaling")


def test_qwen2_slides_from_max_window_layers_only_with_use_sliding_window():
    config = {**SHAPE, "num_hidden_layers": 4, "sliding_window": 32, "max_window_layers": 2}
    for flag in (False, True):
        fields = {**config, "use_sliding_window": flag}
        ours = parse_config({**fields, "architectures": ["Qwen2ForCausalLM"]})
        theirs = _transformers("Qwen2Config", fields)
        expected = _windows(theirs) if theirs.sliding_window else (None,) * 4
        assert ours.layer_windows == expected
    assert expected == (None, None, 32, 32)


PHI3 = {
    **SHAPE,
    "num_hidden_layers": 2,
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 1024,
    "partial_rotary_factor": 0.75,
    "rope_scaling": {
        "type": "longrope",
        "short_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5],
        "long_factor": [2.0, 4.0, 6.0, 8.0, 10.0, 12.0],
    },
}


def test_phi3_longrope_frequencies_are_transformers_short_and_long_ones():
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    ours = parse_config({**PHI3, "architectures": ["Phi3ForCausalLM"]})
    theirs = _transformers("Phi3Config", PHI3)
    mine = RotaryEmbedding(ours.rope, ours.head_dim, ours.max_position_embeddings)
    rotary = transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding(theirs)
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](theirs, None, seq_len=1025)
    assert mine.rotary_dim == 12 and mine.long_from == 1024
    assert torch.equal(mine.inv_freq, rotary.inv_freq) and torch.equal(mine.long_inv_freq, long)
    assert mine.attention_factor == rotary.attention_scaling


@pytest.mark.parametrize("older", ["su", "yarn"])
def test_phi3_older_longrope_names_read_as_longrope(older):
    renamed = {**PHI3, "rope_scaling": {**PHI3["rope_scaling"], "type": older}}
    ours = parse_config({**renamed, "architectures": ["Phi3ForCausalLM"]})
    assert ours.rope == parse_config({**PHI3, "architectures": ["Phi3ForCausalLM"]}).rope


def test_what_transformers_does_not_run_is_refused():
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        parse_config({**GEMMA2, "architectures": ["Gemma2ForCausalLM"], "hidden_activation": "gelu"})
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        parse_config({**GEMMA3, "architectures": ["Gemma3ForCausalLM"], "use_bidirectional_attention": True})
    with pytest.raises(ValueError, match="layer_types"):
        parse_config(
            {**GEMMA2, "architectures": ["Gemma2ForCausalLM"], "layer_types": ["chunked_attention"] * 5}
        )
