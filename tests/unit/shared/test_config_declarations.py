"""The configuration is declared once: `ServeConfig` holds each field one time, and `LLM` takes any of
them as a keyword instead of declaring them again with defaults of its own."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from pagedserve.shared import config as config_module
from pagedserve.shared.config import ServeConfig, config_of
from pydantic import ValidationError

from pagedserve import LLM


def test_no_field_is_declared_twice_in_serve_config():
    """A second annotation of a name in the class body silently replaces the first (its default, its
    limits, its help): the module's source must hold each field once."""
    tree = ast.parse(Path(inspect.getfile(config_module)).read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServeConfig").body
    names = [n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)
    assert set(names) - {"model_config"} == set(ServeConfig.model_fields)


def test_llm_declares_no_field_of_its_own():
    parameters = inspect.signature(LLM.__init__).parameters
    assert list(parameters) == ["self", "model", "overrides"]
    assert parameters["overrides"].kind is inspect.Parameter.VAR_KEYWORD


def test_every_field_is_accepted_and_a_wrong_one_is_named(monkeypatch):
    for name, field in ServeConfig.model_fields.items():
        default = field.get_default(call_default_factory=True)
        assert getattr(config_of(**{name: default}), name) == default, name
    with pytest.raises(ValidationError, match="blok_size"):
        config_of(blok_size=16)
    with pytest.raises(ValidationError, match="block_size must be a power of two"):
        config_of(block_size=12)
    # The declared defaults, not the shell's: LLM's behaviour does not depend on PAGEDSERVE_* variables.
    monkeypatch.setenv("PAGEDSERVE_BLOCK_SIZE", "64")
    assert config_of().block_size == ServeConfig.model_fields["block_size"].default


def test_llm_overrides_reach_the_runner_the_scheduler_and_the_block_manager(tiny_model):
    llm = LLM(
        str(tiny_model("llama")),
        block_size=8,
        num_blocks=48,
        max_num_seqs=3,
        enable_prefix_caching=False,
        lora_modules=[],
    )
    assert llm.runner.block_size == 8 and llm.runner.kv_cache.num_blocks == 48
    assert llm.scheduler.limits.max_num_seqs == 3
    assert not llm.block_manager.enable_prefix_caching
    with pytest.raises(ValidationError, match="max_num_seq\\b"):
        LLM(str(tiny_model("llama")), max_num_seq=3)
