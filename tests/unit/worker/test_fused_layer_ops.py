"""The model on the fused C++ layer ops (norms, residual adds, SiLU-and-mul) against the same model on
the plain torch ops: which it picks where, that both give the same tokens, and the fallback."""

from __future__ import annotations

import random

import pytest
import torch
from pagedserve.kernels import layer_ops
from pagedserve.kernels.cpu.build import KernelBuildError
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.protocol.step import Execute, NewRequest
from worker_driver import GREEDY

PROMPT_LENGTHS = (1, 5, 16, 33)


def _runner(path, dtype: str) -> ModelRunner:
    return ModelRunner(path, dtype=dtype, block_size=16, num_blocks=32, attention_backend="torch")


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


def test_a_failed_build_falls_back_to_the_torch_ops_and_says_so_once(monkeypatch, default_logging):
    from structlog.testing import capture_logs

    def cannot_build() -> None:
        raise KernelBuildError("no compiler here")

    monkeypatch.setattr(layer_ops, "_cpp", None)
    monkeypatch.setattr(layer_ops, "_cpp_failed", False)
    monkeypatch.setattr(layer_ops, "CppLayerOps", cannot_build)
    with capture_logs() as logs:
        first = layer_ops.layer_ops_for(torch.float32, torch.device("cpu"))
        second = layer_ops.layer_ops_for(torch.bfloat16, torch.device("cpu"))
    assert first is second is layer_ops.TORCH_LAYER_OPS
    assert [entry["event"] for entry in logs] == ["cpp_layer_ops_unavailable"]
