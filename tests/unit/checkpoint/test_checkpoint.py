"""services/checkpoint.py: the one reading of a checkpoint folder (context, LongRoPE's switch, EOS,
tokenizer), without torch; and the scheduler admitting only what its active workers serve."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pagedserve.services.checkpoint import context_length, read_checkpoint, resolve_model, rope_switch_at
from pagedserve.services.scheduler.liveness import WorkerLiveness
from pagedserve.services.scheduler.step_clock import StepClock
from pagedserve.shared.protocol.control import Heartbeat

BASE: dict[str, Any] = {"vocab_size": 320, "max_position_embeddings": 512, "eos_token_id": 2}


def write_checkpoint(folder: Path, **config: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**BASE, **config}))
    return folder


@pytest.mark.parametrize(
    "config",
    [
        {"architectures": ["MistralForCausalLM"], "sliding_window": 64},
        {"architectures": ["Qwen2ForCausalLM"], "sliding_window": 64, "use_sliding_window": True},
        {"architectures": ["Gemma2ForCausalLM"], "sliding_window": 13},
        {"architectures": ["Phi3ForCausalLM"], "sliding_window": 29},
    ],
)
def test_a_sliding_window_no_longer_caps_the_context(config: dict[str, Any]) -> None:
    """Windows are exact in every attention backend: the model serves all its positions."""
    assert context_length({**BASE, **config}) == 512


def test_a_nested_text_config_is_read() -> None:
    nested = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {**BASE, "sliding_window": 32},
    }
    assert context_length(nested) == 512


def test_longrope_switches_at_the_original_length() -> None:
    phi3 = {**BASE, "architectures": ["Phi3ForCausalLM"], "original_max_position_embeddings": 48}
    assert (
        rope_switch_at(
            {**phi3, "rope_scaling": {"rope_type": "longrope", "short_factor": [1], "long_factor": [2]}}
        )
        == 48
    )
    assert rope_switch_at({**phi3, "rope_scaling": {"type": "su"}}) == 48  # the older name
    assert rope_switch_at({**phi3, "rope_scaling": {"type": "yarn"}}) == 48  # Phi-3's yarn is LongRoPE
    assert rope_switch_at({**phi3, "rope_scaling": None}) is None
    llama = {
        **BASE,
        "architectures": ["LlamaForCausalLM"],
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
    }
    assert rope_switch_at(llama) is None


def test_eos_ids_are_config_and_generation_config_together(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "m", architectures=["LlamaForCausalLM"])
    assert read_checkpoint(folder).eos_token_ids == (2,)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    checkpoint = read_checkpoint(folder)
    assert checkpoint.eos_token_ids == (2, 7)
    assert (checkpoint.architecture, checkpoint.vocab_size, checkpoint.tokenizer_path) == (
        "LlamaForCausalLM",
        320,
        None,
    )


def test_the_configured_length_never_exceeds_the_positions(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "m", architectures=["MistralForCausalLM"], sliding_window=64)
    checkpoint = read_checkpoint(folder)
    assert [checkpoint.served_len(n) for n in (None, 1000, 40)] == [512, 512, 40]


def test_a_folder_without_config_or_vocab_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        read_checkpoint(tmp_path)
    folder = write_checkpoint(tmp_path / "m", vocab_size=None)
    with pytest.raises(ValueError, match="'vocab_size' must be an integer"):
        read_checkpoint(folder)


def test_reading_a_checkpoint_imports_no_torch(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "m", architectures=["MistralForCausalLM"], sliding_window=64)
    code = (
        "import sys; from pagedserve.services.checkpoint import load_checkpoint; "
        f"print(load_checkpoint({str(folder)!r}).max_model_len, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["512", "False"]
    assert resolve_model(str(folder)) == folder


def announcement(worker_id: str, max_model_len: int) -> Heartbeat:
    return Heartbeat(worker_id, "inc-1", 64, 16, max_model_len)


def test_the_scheduler_admits_only_what_every_active_worker_serves() -> None:
    liveness = WorkerLiveness(
        heartbeat_interval_s=0.5, worker_timeout_s=5.0, steps=StepClock(10.0, 20.0, 30.0)
    )
    assert liveness.served_len(512) == 512  # no worker yet: the checkpoint's context
    short, _ = liveness.heard(announcement("w-short", 64), now=0.0, step_socket=True)
    long, _ = liveness.heard(announcement("w-long", 1024), now=0.0, step_socket=True)
    assert liveness.served_len(512) == 512  # heard, but not active: they take no request yet
    short.active = long.active = True
    assert liveness.served_len(512) == 64
    liveness.drop("w-short")
    assert liveness.served_len(512) == 512  # never above the checkpoint's own
