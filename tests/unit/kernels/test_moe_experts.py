"""The fused MoE experts op (kernels/cpu/moe_experts.cpp) on every ISA path this CPU runs, against the
definition over the dequantized weights: per token, the weighted sum of its experts' gated MLPs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from harness.gguf_models import quantize

from pagedserve.kernels.cpu.build import QUANT_LINEAR, load_extension
from pagedserve.services.worker.layers.quant_linear import KERNEL_TYPES

EXPERTS, TOP_K = 5, 3


@pytest.fixture(scope="module")
def ops(isa: str) -> Any:
    return load_extension(QUANT_LINEAR, isa)


def _experts(hidden: int, size: int, gate_up_type: str, down_type: str, seed: int = 0):
    """-> (gate_up blocks, down blocks, dequantized gate_up [E, 2I, H], dequantized down [E, H, I])."""
    rng = np.random.default_rng(seed)
    gate_up = rng.standard_normal((EXPERTS * 2 * size, hidden), dtype=np.float32) * 0.2
    down = rng.standard_normal((EXPERTS * hidden, size), dtype=np.float32) * 0.2
    gu_blocks, gu_values = quantize(gate_up, gate_up_type)
    d_blocks, d_values = quantize(down, down_type)
    return (
        torch.from_numpy(gu_blocks),
        torch.from_numpy(d_blocks),
        torch.from_numpy(gu_values).view(EXPERTS, 2 * size, hidden),
        torch.from_numpy(d_values).view(EXPERTS, hidden, size),
    )


def _reference(x, ids, weights, gate_up, down) -> torch.Tensor:
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in sorted(range(ids.shape[1]), key=lambda j: int(ids[t, j])):
            e = int(ids[t, j])
            gate, up = (gate_up[e].double() @ x[t].double()).chunk(2)
            out[t] += weights[t, j].double() * (down[e].double() @ (F.silu(gate) * up))
    return out


CASES = [("Q4_0", "Q4_0", 64, 32), ("Q8_0", "Q4_1", 96, 64), ("Q4_K", "Q8_0", 256, 32)]


@pytest.mark.parametrize(("gate_up_type", "down_type", "hidden", "size"), CASES)
@pytest.mark.parametrize("rows", [1, 2, 13, 40])  # 40 tokens: experts of ~24 rows, the kernel's panels
def test_fused_experts_equal_the_definition(ops, gate_up_type, down_type, hidden, size, rows):
    gu_blocks, d_blocks, gate_up, down = _experts(hidden, size, gate_up_type, down_type)
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, hidden, generator=generator)
    ids = torch.stack([torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(rows)])
    weights = torch.rand(rows, TOP_K, generator=generator)
    got = ops.moe_experts(
        x, ids, weights, gu_blocks, KERNEL_TYPES[gate_up_type], d_blocks, KERNEL_TYPES[down_type], EXPERTS, 0
    )
    expected = _reference(x, ids, weights, gate_up, down)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_one_expert_or_many_and_any_thread_count_give_the_same_sums(ops, threads):
    """Fewer experts hit than threads run one by one; more are shared out among the threads."""
    gu_blocks, d_blocks, gate_up, down = _experts(64, 32, "Q8_0", "Q8_0")
    x = torch.randn(6, 64)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for ids in (torch.full((6, 1), 2), torch.tensor([[0, 4], [1, 3], [2, 0], [4, 1], [3, 2], [0, 1]])):
            weights = torch.rand(ids.shape)
            got = ops.moe_experts(x, ids, weights, gu_blocks, 8, d_blocks, 8, EXPERTS, 0)
            torch.testing.assert_close(
                got.double(), _reference(x, ids, weights, gate_up, down), rtol=1e-4, atol=1e-4
            )
    finally:
        torch.set_num_threads(previous)


def test_an_expert_id_outside_the_experts_is_refused(ops):
    gu_blocks, d_blocks, _, _ = _experts(64, 32, "Q8_0", "Q8_0")
    with pytest.raises(RuntimeError, match=r"expert id 5 is outside \[0, 5\)"):
        ops.moe_experts(
            torch.randn(1, 64), torch.tensor([[5]]), torch.ones(1, 1), gu_blocks, 8, d_blocks, 8, 5, 0
        )
