"""`pagedserve bench` efficiency: the workload's model FLOPs by hand on a tiny config, the matmul
ceiling probe, and each path's FLOP/s and share of the ceiling in the report."""

from __future__ import annotations

import pytest
import torch

from pagedserve.ops.bench.efficiency import (
    Ceiling,
    ModelFlops,
    efficiency_json,
    layer_matmul_weights,
    matmul_ceiling,
    model_flops,
)
from pagedserve.ops.bench.peers import PathResult
from pagedserve.ops.bench.report import build_report
from pagedserve.ops.bench.workload import Workload
from pagedserve.services.worker.models.registry import ModelConfig, parse_config


def tiny_config() -> ModelConfig:
    return parse_config(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 10,
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 4,
        }
    )


def test_a_layer_counts_its_q_k_v_o_and_mlp_weights() -> None:
    # q 8x8 + k 8x4 + v 8x4 + o 8x8 + gate, up, down 3 x 8x16
    assert layer_matmul_weights(tiny_config()) == 64 + 32 + 32 + 64 + 3 * 128


def test_model_flops_of_one_request_by_hand() -> None:
    # 3 prompt tokens, 2 outputs: the layers read 4 positions (the last output is never fed back).
    flops = model_flops(tiny_config(), Workload(prompts=[[1, 2, 3]], output_lens=[2], seed=0))
    assert flops.layer_matmuls == 2 * (2 * 576) * 4  # 2 FLOPs x 2 layers' 576 weights x 4 positions
    assert flops.lm_head == 2 * 8 * 10 * 2  # hidden x vocab, for the 2 sampled positions
    # Positions 1..4 attend to 1+2+3+4 = 10 keys; per key and layer QK^T + PV = 2 x 2 x heads x head_dim.
    assert flops.attention == 10 * 2 * (2 * 2 * 2 * 4)
    assert flops.total == 9216 + 320 + 640


def test_model_flops_add_up_over_requests() -> None:
    cfg = tiny_config()
    a, b = Workload([[1] * 5], [3], 0), Workload([[1] * 2], [7], 0)
    both = model_flops(cfg, Workload([[1] * 5, [1] * 2], [3, 7], 0))
    assert both.total == model_flops(cfg, a).total + model_flops(cfg, b).total


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_ceiling_probe_times_the_best_gemm_in_the_given_dtype(dtype: str) -> None:
    ceiling = matmul_ceiling(dtype, (16, 32, 64), budget_s=0.01)
    assert ceiling.flop_per_s > 0 and ceiling.dtype == dtype
    assert ceiling.calls >= 30 and ceiling.threads == torch.get_num_threads()
    assert ceiling.kernel in ("torch.mm", "onednn-packed")


def test_each_path_gets_its_flop_per_s_and_share_of_the_best_ceiling() -> None:
    flops = ModelFlops(layer_matmuls=600, lm_head=300, attention=100)
    probes = [Ceiling(2000.0, (1, 1, 1), "float32", 2, 10), Ceiling(4000.0, (1, 1, 1), "float32", 2, 10)]
    report = build_report(
        config={},
        workload={},
        paths=[PathResult("pagedserve", 50, 0.5), PathResult("vllm", 50, 0.25), PathResult("x", error="no")],
        services=[PathResult("services", 50, 1.0, details={"pipeline_depth": 2, "idle_fraction": 0.0})],
        max_len_kv={"max_model_len": 512, "kv_utilization": 0.3},
        efficiency=efficiency_json(flops, probes),
    )
    assert report["efficiency"]["ceiling_flop_per_s"] == 4000.0
    rows = {r["name"]: r for r in report["paths"]}
    assert rows["pagedserve"]["model_flop_per_s"] == 2000.0  # 1000 FLOPs in 0.5 s
    assert rows["pagedserve"]["ceiling_fraction"] == 0.5
    assert rows["vllm"]["ceiling_fraction"] == 1.0
    assert rows["x"]["model_flop_per_s"] is None and rows["x"]["ceiling_fraction"] is None
    assert report["services"][0]["ceiling_fraction"] == 0.25  # the services run the same FLOPs in 1 s
