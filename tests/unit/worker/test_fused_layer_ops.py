"""The model on the fused C++ layer ops (norms, residual adds, SiLU-and-mul) against the same model on
the plain torch ops: which it picks where, that both give the same tokens, and the fallback."""

from __future__ import annotations

import random

import pytest
import torch
from worker_driver import GREEDY

from pagedserve.kernels import layer_ops
from pagedserve.kernels.cpu import build, dispatch
from pagedserve.kernels.cpu.isa import ISA_ENV, runnable_isas
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.protocol.step import Execute, NewRequest

PROMPT_LENGTHS = (1, 5, 16, 33)


def _runner(path, dtype: str) -> ModelRunner:
    # allow_slow_dtype: the fused ops' choice is checked in bf16/fp16 on any CPU, tiny models only.
    return ModelRunner(
        path, dtype=dtype, block_size=16, num_blocks=32, attention_backend="torch", allow_slow_dtype=True
    )


def _prefill_logits(runner: ModelRunner) -> torch.Tensor:
    rng = random.Random(0)
    step, next_block = Execute(0), 0
    for i, n in enumerate(PROMPT_LENGTHS):
        prompt = [rng.randrange(3, 259) for _ in range(n)]
        blocks = list(range(next_block, next_block + -(-(n + 1) // 16)))
        next_block += len(blocks)
        step.new_requests.append(NewRequest(f"r{i}", prompt, n, 0, n, blocks, GREEDY))
    _result, logits = runner.execute_with_logits(step)
    assert logits is not None
    return logits.float()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_cpu_model_runs_the_fused_ops_in_float32_and_bfloat16(tiny_model, dtype):
    assert _runner(tiny_model("llama"), dtype).model.layer_ops.name == "cpp"


def test_float16_runs_the_torch_ops(tiny_model):
    assert _runner(tiny_model("llama"), "float16").model.layer_ops.name == "torch"


@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # qwen3: the per-head q/k norms too
def test_fused_and_plain_ops_give_the_same_float32_logits_but_for_rounding(tiny_model, arch):
    fused = _prefill_logits(_runner(tiny_model(arch), "float32"))
    plain_runner = _runner(tiny_model(arch), "float32")
    assert plain_runner.model.use_fused_ops(False) == "torch"
    plain = _prefill_logits(plain_runner)
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)
    assert torch.equal(fused.argmax(-1), plain.argmax(-1))


@pytest.fixture
def default_logging():
    """structlog at its defaults for one test: another test in the same process may have configured
    a level filter that drops warnings before capture_logs sees them."""
    import structlog

    saved = structlog.get_config()
    structlog.reset_defaults()
    yield
    structlog.configure(**saved)


def _fresh_loader(monkeypatch) -> None:
    """Forget, for one test, every build this process loaded and every path it chose or saw fail."""
    monkeypatch.setattr(layer_ops, "_cpp", None)
    monkeypatch.setattr(layer_ops, "_cpp_failed", False)
    monkeypatch.setattr(dispatch, "_paths", {})
    monkeypatch.setattr(build, "_loaded", set())


def test_a_failed_build_falls_back_to_the_torch_ops_and_says_so_once(tmp_path, monkeypatch, default_logging):
    """A real build that fails (a compiler that exits 1, in an empty cache): the model gets the torch
    ops, and each path that failed is logged once, on the first call, not on later ones."""
    from structlog.testing import capture_logs

    calls = tmp_path / "compiler-calls"
    compiler = tmp_path / "broken-c++"
    compiler.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho "error: no compiler today" >&2\nexit 1\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(ISA_ENV, raising=False)
    _fresh_loader(monkeypatch)

    with capture_logs() as logs:
        first = layer_ops.layer_ops_for(torch.float32, torch.device("cpu"))
        second = layer_ops.layer_ops_for(torch.bfloat16, torch.device("cpu"))
    assert first is second is layer_ops.TORCH_LAYER_OPS
    assert calls.read_text()  # the compiler was really asked, and failed
    assert [(entry["event"], entry["op"], entry["isa"]) for entry in logs] == [
        ("cpp_kernel_unavailable", "layer_ops", isa) for isa in runnable_isas()
    ]
    assert all("layer_ops [" in entry["reason"] and "did not build" in entry["reason"] for entry in logs)
    assert dispatch.kernel_paths()["layer_ops"] == "torch"


def test_the_forced_isa_path_is_the_one_the_model_gets(isa, monkeypatch):
    monkeypatch.setenv(ISA_ENV, isa)
    _fresh_loader(monkeypatch)
    ops = layer_ops.layer_ops_for(torch.float32, torch.device("cpu"))
    assert isinstance(ops, layer_ops.CppLayerOps) and ops.isa == isa
    assert dispatch.kernel_paths()["layer_ops"] == isa
    assert layer_ops.layer_ops_for(torch.bfloat16, torch.device("cpu")) is ops
    x, weight = torch.randn(3, 40), torch.rand(40) + 0.5
    torch.testing.assert_close(
        ops.rms_norm(x, weight, 1e-6),
        layer_ops.TORCH_LAYER_OPS.rms_norm(x, weight, 1e-6),
        rtol=1e-6,
        atol=1e-6,
    )
