"""Configuration: one validated model, settable from defaults, `PAGEDSERVE_*` variables and CLI flags.

Precedence: CLI flag > environment variable > default. The fields are declared in sections
(config_sections.py), each in one; `ServeConfig` is all of them, flat, so every field has one flag and
one variable, and a deployment is configured in one vocabulary. Each command takes the flags of the
sections it runs; a part that needs one concern takes its section whole (`config.section(...)`).
"""

from __future__ import annotations

import argparse
from typing import Any, TypeVar

from pydantic import ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from pagedserve.shared.config_sections import (
    ApiSection,
    CacheSection,
    DeploymentSection,
    EndpointsSection,
    LoggingSection,
    LoraSection,
    ModelSection,
    ReliabilitySection,
    RouterSection,
    SchedulerSection,
    Section,
    SecuritySection,
    parse_bytes,
)

__all__ = ["ServeConfig", "parse_bytes"]

S = TypeVar("S", bound=Section)

# The sections by the name commands use (COMMAND_SECTIONS), in the order their flags are listed.
SECTION_TYPES: dict[str, type[Section]] = {
    "model": ModelSection,
    "lora": LoraSection,
    "cache": CacheSection,
    "scheduler": SchedulerSection,
    "reliability": ReliabilitySection,
    "deployment": DeploymentSection,  # read by `pagedserve up`'s supervisor
    "endpoints": EndpointsSection,
    "api": ApiSection,
    "router": RouterSection,
    "security": SecuritySection,
    "logging": LoggingSection,
}


# Bases last to first: pydantic lists inherited fields from the last base on, so model's come first.
class ServeConfig(
    LoggingSection,
    SecuritySection,
    RouterSection,
    ApiSection,
    EndpointsSection,
    DeploymentSection,
    ReliabilitySection,
    SchedulerSection,
    CacheSection,
    LoraSection,
    ModelSection,
    BaseSettings,
):
    """Every knob of a pagedserve deployment: every section's fields. Field docs become the CLI help."""

    model_config = SettingsConfigDict(
        env_prefix="PAGEDSERVE_", extra="forbid", validate_assignment=True, frozen=False
    )

    def section(self, kind: type[S]) -> S:
        """The fields of one section, as that section's own (frozen) model."""
        return kind.model_construct(**{name: getattr(self, name) for name in kind.model_fields})

    @model_validator(mode="after")
    def _tensor_parallel_fits(self) -> ServeConfig:
        if self.tensor_parallel_size > 1:
            _check_tensor_parallel(self)
        return self


def _check_tensor_parallel(config: ServeConfig) -> None:
    """What a tensor-parallel group does not run (yet): each named, refused at start."""
    size = config.tensor_parallel_size
    if config.max_loras:
        raise ValueError(f"tensor_parallel_size {size} does not run LoRA adapters: set max_loras 0")
    if config.speculative_config is not None:
        raise ValueError(
            f"tensor_parallel_size {size} does not run speculative decoding: unset speculative_config"
        )
    if config.quantization not in ("auto", "none"):
        # Packed blocks slice cleanly by rows, but a row-parallel slice must fall on quant-block bounds:
        # not built. `auto` loads such a checkpoint dense under tensor parallelism.
        raise ValueError(
            f"tensor_parallel_size {size} loads weights dense: quantization {config.quantization!r} is not "
            "supported with it (use auto or none)"
        )


# The fields of each section (each field in one: a test holds it), and the sections each command runs:
# a command takes the flags of its sections only (`pagedserve block-manager --help` lists no model or
# API flag); every field stays settable by its PAGEDSERVE_* variable everywhere.
SECTIONS: dict[str, tuple[str, ...]] = {
    name: tuple(kind.model_fields) for name, kind in SECTION_TYPES.items()
}
_EVERY_PROCESS = ("reliability", "endpoints", "security", "logging")
COMMAND_SECTIONS: dict[str, tuple[str, ...]] = {
    "block-manager": ("cache", *_EVERY_PROCESS),
    "scheduler": ("model", "lora", "cache", "scheduler", *_EVERY_PROCESS),
    "worker": ("model", "lora", "cache", "scheduler", *_EVERY_PROCESS),
    "api": ("model", "lora", "scheduler", "api", *_EVERY_PROCESS),
    "router": ("router", "cache", *_EVERY_PROCESS),
}


def command_fields(command: str) -> list[str]:
    """The fields whose flags `command` takes: its sections' (every field for a command that runs the
    whole deployment: up, serve, demo)."""
    sections = COMMAND_SECTIONS.get(command, tuple(SECTIONS))
    return [name for section in sections for name in SECTIONS[section]]


class _DeclaredDefaults(ServeConfig):
    """ServeConfig from its declared defaults and the fields given, never the PAGEDSERVE_* environment."""

    model_config = SettingsConfigDict(title="ServeConfig")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def config_of(**fields: Any) -> ServeConfig:
    """The declared defaults plus `fields`, validated as a deployment's configuration is (a wrong name or
    value: ValidationError naming the field), without the environment: for `LLM(model, **overrides)`,
    whose defaults must not change with the shell it runs in."""
    return _DeclaredDefaults(**fields)


def add_config_args(parser: argparse.ArgumentParser, fields: list[str] | None = None) -> None:
    """Add one `--flag` per config field (or per name in `fields`); unset flags stay None."""
    for name, info in ServeConfig.model_fields.items():
        if fields is not None and name not in fields:
            continue
        flag = "--" + name.replace("_", "-")
        if info.annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=info.description
            )
        elif getattr(info.annotation, "__origin__", None) is list:
            parser.add_argument(flag, dest=name, nargs="+", default=None, help=info.description)
        else:
            parser.add_argument(
                flag, dest=name, default=None, help=f"{info.description} (default: {info.default})"
            )


def config_from_args(args: argparse.Namespace, **overrides: Any) -> ServeConfig:
    """Environment and defaults, then every flag the user actually gave, then explicit overrides."""
    given = {k: v for k, v in vars(args).items() if k in ServeConfig.model_fields and v is not None}
    given.update(overrides)
    return ServeConfig(**given)


def config_default(name: str) -> Any:
    """A field's default as declared here, never the environment's value: for signatures (LLM, the
    model runner, the scheduler's limits) that must default the way a deployment does."""
    return ServeConfig.model_fields[name].default


class _FieldValue:
    """A flag's value read as the field reads it (its type, units and checks), for argparse."""

    def __init__(self, name: str) -> None:
        self.__name__ = name  # argparse names the field in its error: "invalid block_size value: '7'"

    def __call__(self, text: str) -> Any:
        try:
            return getattr(config_of(**{self.__name__: text}), self.__name__)
        except ValidationError as exc:  # the field's own words: "must be a power of two from 8 to 128"
            raise argparse.ArgumentTypeError(f"{text!r}: {exc.errors()[0]['msg']}") from None


def add_config_flag(parser: argparse.ArgumentParser, name: str, default: Any = None, **kwargs: Any) -> None:
    """One field's flag for a tool that runs no service itself (a bench, a microbench): its name, help
    and parsing (units included) come from the declaration; `default` is the tool's own (None: the
    field's declared default)."""
    info = ServeConfig.model_fields[name]
    parser.add_argument(
        "--" + name.replace("_", "-"),
        dest=name,
        type=_FieldValue(name),
        default=info.default if default is None else default,
        help=kwargs.pop("help", info.description),
        **kwargs,
    )
