"""`--lora-modules name=path ...` from the command line, the environment and the supervisor's hand-off,
and the registry's refusals."""

from __future__ import annotations

import argparse
import json

import numpy as np
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
    with pytest.raises(ValueError, match="no adapter_config.json there"):
        registry.add("other", str(tmp_path / "missing"))
    registry.remove("sql")
    again = registry.add("sql", str(tmp_path))
    assert again.namespace != first.namespace  # a reload never shares the old load's cached KV
    with pytest.raises(KeyError, match="'x' is not loaded"):
        registry.remove("x")


def test_a_gguf_adapter_file_is_registered_and_checked_from_its_tensor_table(tiny_model, tmp_path):
    import gguf
    from harness.lora_adapters import make_peft_adapter, peft_to_gguf

    from pagedserve.services.lora_check import check_adapter

    base = tiny_model("qwen2")
    hf_config = json.loads((base / "config.json").read_text())
    good = peft_to_gguf(make_peft_adapter(base, tmp_path / "peft", rank=8), base, tmp_path / "good.gguf")
    registry = LoRARegistry(check=lambda path: check_adapter(path, hf_config, 16))
    assert registry.add("g", str(good)).path == str(good.resolve())
    with pytest.raises(ValueError, match=r"good.gguf: blk.0.\w+.weight.lora_a has rank 8 > max_lora_rank 4"):
        check_adapter(good, hf_config, 4)
    model_file = tmp_path / "weights.gguf"  # weights, not an adapter
    writer = gguf.GGUFWriter(model_file, "qwen2")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((8, 32), np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        step()
    writer.close()
    with pytest.raises(ValueError, match=r"weights.gguf: not a LoRA adapter file \(general.type None"):
        registry.add("w", str(model_file))
    with pytest.raises(ValueError, match="neither a PEFT adapter folder .* nor a .gguf adapter file"):
        registry.add("x", str(tmp_path / "missing.gguf"))
    assert registry.names() == ["g"]
