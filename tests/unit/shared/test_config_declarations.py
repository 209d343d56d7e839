"""The configuration is declared once: `ServeConfig` holds each field one time, and `LLM` takes any of
them as a keyword instead of declaring them again with defaults of its own."""

from __future__ import annotations

import argparse
import ast
import inspect
from pathlib import Path

import pytest
from pydantic import ValidationError

from pagedserve import LLM
from pagedserve.shared import config as config_module
from pagedserve.shared import config_sections
from pagedserve.shared.config import SECTIONS, ServeConfig, add_config_flag, command_fields, config_of
from pagedserve.shared.config_sections import CacheSection, RouterSection


def test_no_field_is_declared_twice_in_serve_config():
    """A second annotation of a name silently replaces the first (its default, its limits, its help),
    in one class body or between two sections that ServeConfig inherits: the sections' source must
    hold each field once, and ServeConfig itself declares none."""
    names: list[str] = []
    for module in (config_sections, config_module):
        tree = ast.parse(Path(inspect.getfile(module)).read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                names += [
                    n.target.id
                    for n in node.body
                    if isinstance(n, ast.AnnAssign)
                    and isinstance(n.target, ast.Name)
                    and n.target.id != "model_config"
                ]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)
    assert set(names) == set(ServeConfig.model_fields)


def test_a_section_is_its_fields_read_only():
    config = config_of(router_policy="least_load", router_balance_abs=17, block_size=32)
    router = config.section(RouterSection)
    assert type(router) is RouterSection and set(type(router).model_fields) == set(SECTIONS["router"])
    assert router.router_policy == "least_load" and router.router_balance_abs == 17
    with pytest.raises(ValidationError):
        router.router_policy = "round_robin"  # type: ignore[misc]
    assert config.section(CacheSection).block_size == 32


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


def test_every_field_is_in_one_section():
    names = [name for fields in SECTIONS.values() for name in fields]
    assert sorted(names) == sorted(ServeConfig.model_fields), "a field in no section, or in two"


SERVICE_PACKAGES = {
    "block-manager": "services/block_manager",
    "scheduler": "services/scheduler",
    "worker": "services/worker",
    "api": "services/api",
}


@pytest.mark.parametrize("command", list(SERVICE_PACKAGES))
def test_each_service_reads_only_fields_its_command_takes(command):
    """A service reading a field outside its command's sections would have no flag for it."""
    root = Path(inspect.getfile(config_module)).parents[1]
    fields, takes, read = set(ServeConfig.model_fields), set(command_fields(command)), set()
    for path in (root / SERVICE_PACKAGES[command]).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "config"
                and node.attr in fields
            ):
                read.add(node.attr)
    assert read, command
    assert read <= takes, sorted(read - takes)


@pytest.mark.parametrize("command", list(SERVICE_PACKAGES))
def test_a_service_command_lists_only_its_sections_flags(command):
    from pagedserve.ops.cli.command import build_parser

    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {
        option
        for action in subparsers.choices[command]._actions
        for option in action.option_strings
        if option.startswith("--")
    }
    want = {"--" + name.replace("_", "-") for name in command_fields(command)}
    want |= {
        "--no-" + name.replace("_", "-")
        for name in command_fields(command)
        if ServeConfig.model_fields[name].annotation is bool
    }
    assert flags - {"--help", "--failpoints", "--standby"} == want
    if command == "block-manager":
        assert "--model" not in flags and "--api-port" not in flags


def test_a_tools_flag_reads_as_its_field_does_units_and_limits_included(capsys):
    parser = argparse.ArgumentParser(prog="tool")
    add_config_flag(parser, "kv_cache_memory", "1GiB")
    add_config_flag(parser, "block_size", 16)
    add_config_flag(parser, "dtype")
    assert vars(parser.parse_args([])) == {"kv_cache_memory": 1 << 30, "block_size": 16, "dtype": "float32"}
    assert parser.parse_args(["--kv-cache-memory", "512MiB"]).kv_cache_memory == 512 << 20
    with pytest.raises(SystemExit):
        parser.parse_args(["--block-size", "7"])
    assert "power of two from 8 to 128" in capsys.readouterr().err


def test_no_tool_in_ops_declares_a_settings_flag_by_hand():
    """A bench's --block-size is the deployment's block_size: declared once, read the same way."""
    hand_made = []
    for path in sorted(Path(config_module.__file__).parents[1].joinpath("ops").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "add_argument"
                and node.args
            ):
                flag = node.args[0]
                if isinstance(flag, ast.Constant) and str(flag.value).startswith("--"):
                    name = flag.value.removeprefix("--").replace("-", "_")
                    if name in ServeConfig.model_fields and name not in _SAME_NAME_OTHER_MEANING.get(
                        path.name, ()
                    ):
                        hand_made.append(f"{path.name}: {flag.value}")
    assert hand_made == []


# Flags that share a field's name but not its meaning: a client's model name and key, a sweep of dtypes.
_SAME_NAME_OTHER_MEANING = {
    "serve.py": ("model", "api_key"),
    "drive.py": ("model",),
    "client_checks.py": ("model", "api_key"),
    "speculative.py": ("speculative_config",),  # the bench's JSON text, written into each run's config
    "moe_ab.py": ("model",),  # a path to a generated checkpoint, made if missing
    "step_profile.py": ("dtype", "quantization"),  # sweeps: each value is a run
}
