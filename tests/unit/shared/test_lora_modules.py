"""`--lora-modules name=path ...` from the command line, the environment and the supervisor's hand-off,
and the registry's refusals."""

from __future__ import annotations

import argparse
import json

import pytest

from pagedserve.ops.deploy.supervisor import config_env
from pagedserve.shared.config import ServeConfig, add_config_args, config_from_args
from pagedserve.shared.lora_modules import LoRARegistry, parse_lora_modules


def test_lora_modules_parse_from_flags_and_travel_to_children_as_json(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    args = parser.parse_args(["--max-loras", "2", "--lora-modules", "sql=/a/sql", "chat=/a/chat"])
    config = config_from_args(args)
    assert config.max_loras == 2 and config.lora_modules == ["sql=/a/sql", "chat=/a/chat"]
    env = config_env(config, base={})
    assert json.loads(env["PAGEDSERVE_LORA_MODULES"]) == ["sql=/a/sql", "chat=/a/chat"]
    monkeypatch.setenv("PAGEDSERVE_LORA_MODULES", env["PAGEDSERVE_LORA_MODULES"])
    assert ServeConfig().lora_modules == config.lora_modules  # a child reads it back
    assert parse_lora_modules(config.lora_modules) == [("sql", "/a/sql"), ("chat", "/a/chat")]
    with pytest.raises(ValueError, match="'nopath' must be name=path"):
        parse_lora_modules(["nopath"])


def test_the_registry_refuses_bad_names_taken_names_and_missing_folders(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    registry = LoRARegistry()
    first = registry.add("sql", str(tmp_path))
    with pytest.raises(ValueError, match="'sql' is already loaded"):
        registry.add("sql", str(tmp_path))
    with pytest.raises(ValueError, match="without spaces"):
        registry.add("a b", str(tmp_path))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        registry.add("other", str(tmp_path / "missing"))
    registry.remove("sql")
    again = registry.add("sql", str(tmp_path))
    assert again.namespace != first.namespace  # a reload never shares the old load's cached KV
    with pytest.raises(KeyError, match="'x' is not loaded"):
        registry.remove("x")
