"""bfloat16 where the CPU runs it, a clear refusal where it does not: never a crash, never a crawl."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from pagedserve.services.worker.cpu_dtype import UnsupportedDtype, check_cpu_dtype, onednn_supports
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.services.worker.weights.loader import resolve_dtype


def test_bfloat16_is_refused_when_the_isa_setting_hides_avx512(tiny_model, monkeypatch):
    """How the refusal is shown on a CPU that has bf16: the ISA setting takes AVX-512 away."""
    monkeypatch.setenv("PAGEDSERVE_CPU_ISA", "avx2")
    with pytest.raises(UnsupportedDtype) as refused:
        ModelRunner(tiny_model("llama"), dtype="bfloat16", block_size=8, num_blocks=16)
    message = str(refused.value)
    assert "PAGEDSERVE_CPU_ISA=avx2" in message and "avx512_bf16" in message and "float32" in message


@pytest.mark.skipif(
    onednn_supports("bfloat16"), reason="this CPU runs bfloat16 natively (oneDNN has a bf16 path)"
)
def test_bfloat16_is_refused_on_a_cpu_without_it_naming_the_missing_feature():
    with pytest.raises(UnsupportedDtype, match="lacks amx_bf16 or avx512_bf16"):
        check_cpu_dtype("bfloat16")


@pytest.mark.skipif(not onednn_supports("bfloat16"), reason="this CPU has no native bfloat16 path")
def test_bfloat16_is_accepted_where_the_cpu_runs_it():
    check_cpu_dtype("bfloat16")


def test_float32_auto_and_cuda_are_never_refused(monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CPU_ISA", "avx2")
    check_cpu_dtype("float32")
    check_cpu_dtype("bfloat16", "cuda")
    assert resolve_dtype("auto", "cpu") == "float32"  # auto never picks what would be refused


def test_the_model_code_still_runs_bfloat16_when_a_test_allows_it(tiny_model, monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CPU_ISA", "avx2")
    runner = ModelRunner(
        tiny_model("llama"), dtype="bfloat16", block_size=8, num_blocks=16, allow_slow_dtype=True
    )
    assert runner.model.embed_tokens.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("command", ["up", "worker"])
def test_the_cli_refuses_bfloat16_before_starting_anything(tiny_model, command):
    """`up` checks before it spawns a worker (one that cannot load would be restarted forever); a
    worker started alone says why and exits 2."""
    env = {**os.environ, "PAGEDSERVE_CPU_ISA": "avx2"}
    argv = [
        sys.executable,
        "-m",
        "pagedserve.ops.cli",
        command,
        "--model",
        str(tiny_model("llama")),
        "--dtype",
        "bfloat16",
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "dtype bfloat16" in done.stderr and "avx512_bf16" in done.stderr
    assert "Traceback" not in done.stderr
