"""A mixture-of-experts GGUF through our quantized path against llama.cpp's own logits for the same file:
a small random Qwen3-MoE written by ops/models/random_moe_gguf.py (8 experts, top-2, the bundled
tokenizer, weights drawn wide enough that the next-token distributions are peaked), quantized to Q4_0
and Q8_0 by the gguf package. The last position's logits of a fixed prompt set from llama-cpp-python in
its own venv (LLAMACPP_VENV, default .venv-llamacpp at the repo root) and from our worker with
--quantization gguf.

Policy. llama.cpp quantizes activations to 8 bits, we do not by default (and do, another way, with
int8 activations): the logits differ a little, and that is held to what the dense bundled model's test
holds (tests/slow/test_quantized_vs_llamacpp.py: KL under 0.05 nats), on all but a few prompts. Those few
are routed differently: a random router's probabilities are near uniform, the k-th and (k+1)-th best
experts of some token are often within 1% of each other (measured on these prompts: 0.06-6%), the
activations' rounding through a stack of quantized linears is of that order, and one token taking
another expert moves the prompt's logits as a whole. Seen on the Q4_0 file, 24 prompts: 3 prompts at KL
0.2-0.9 in float32 mode, 3 in int8 mode; on two of them both our modes agree with transformers over the
GGUF's dequantized weights (KL 0.0000 on the 8 checked) and llama.cpp's logits differ from all three.
So: at most 4 of the 24 prompts at KL >= 0.05 in float32 mode; on the others top-1 equal, except where
llama.cpp's own two best logits are within 0.2 (a coin flip for any two arithmetics: seen at gaps of
0.005 and 0.04); and the median KL under 0.01.

int8 mode is scored as decode rows are run: each prompt alone, in steps of INT8_CHUNK tokens, so every
row takes the integer dot products (a whole batch of prompts in one step is past the panels' 24 rows,
which int8 mode runs in float32: until Dec 2026 this test scored that way and so compared float32 with
llama.cpp in both modes). int8 activations round each linear's input to 8 bits a block, coarser than
float32, and more near-tied experts flip: measured 5 of 24 prompts at KL >= 0.05 on Q4_0 and 2 on Q8_0
(float32 mode: 3 and 1), not the same prompts as float32's, the others at KL 0.0005-0.004 as in float32
mode. Its bound is 6 (a quarter of the prompts). Skips, saying so, where the venv is absent."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_quantized_vs_llamacpp import INT8_CHUNK, llamacpp_last_logits, ours_against
from test_quantized_vs_llamacpp import PROMPTS as DENSE_PROMPTS

from pagedserve.ops.bench.llamacpp_server import llamacpp_venv, llamacpp_venv_ready
from pagedserve.ops.models.random_moe_gguf import Shape, make_folder
from pagedserve.services.scheduler.model_info import load_tokenizer
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.services.worker.weights.gguf_weights import gguf_source

pytestmark = pytest.mark.slow

# Prompts at KL >= 0.05 allowed per activation mode (see the policy above).
REROUTED_AT_MOST = {"float32": 4, "int8": 6}

PROMPTS = [
    *DENSE_PROMPTS,
    "The sun rises in the",
    "import numpy as np\n",
    "My favourite book is",
    "Photosynthesis converts",
    "The recipe calls for two cups of",
    "In 1969, the first",
    "SELECT name FROM users WHERE",
    "The quick brown fox",
    "A haiku about winter:",
    "The French word for cheese is",
    "Dear hiring manager,",
    "The derivative of x squared is",
    "She opened the door and saw",
    "Rust's borrow checker",
    "The population of Tokyo is about",
    "Q: What is 7 times 8? A:",
]
SHAPE = Shape(
    hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, experts=8, top_k=2, expert_size=256, std=0.1
)


@pytest.fixture(scope="module", params=["Q4_0", "Q8_0"])
def moe_and_logits(request, tmp_path_factory) -> tuple[Path, list[list[int]], torch.Tensor]:
    """(the MoE checkpoint folder, the prompts' token ids, llama.cpp's last-position logits)."""
    venv = llamacpp_venv()
    if not llamacpp_venv_ready(venv):  # an optional peer: CI and fresh clones have no such venv
        pytest.skip(f"no finished llama.cpp venv at {venv} (run ops/peers/setup_llamacpp.sh)")
    tmp = tmp_path_factory.mktemp(f"moe-{request.param}")
    folder = make_folder(request.param, tmp / "moe", SHAPE, None)
    prompts = [load_tokenizer(folder).encode(p) for p in PROMPTS]
    return folder, prompts, llamacpp_last_logits(venv, gguf_source(folder), prompts, tmp)


@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_moe_logits_agree_with_llamacpp_on_the_same_gguf(moe_and_logits, activations, monkeypatch) -> None:
    folder, prompts, theirs = moe_and_logits
    monkeypatch.setenv("PAGEDSERVE_QUANT_ACTIVATIONS", activations)  # read as the linears are built
    runner = ModelRunner(folder, quantization="gguf", block_size=16, num_blocks=64)
    assert runner.runtime["weights"].startswith("gguf Q"), runner.runtime
    ours, kl = ours_against(theirs, runner, prompts, INT8_CHUNK if activations == "int8" else None)
    assert theirs.std(-1).min().item() > 0.5, "llama.cpp's logits are flat: the model says nothing to compare"
    assert all(math.isfinite(v) for v in kl.tolist()), kl.tolist()
    rerouted = kl >= 0.05
    assert rerouted.sum().item() <= REROUTED_AT_MOST[activations] and kl.median().item() < 0.01, kl.tolist()
    best_two = theirs.topk(2).values
    clear = (best_two[:, 0] - best_two[:, 1] >= 0.2) & ~rerouted
    differs = clear & (ours.argmax(-1) != theirs.argmax(-1))
    assert not differs.any(), f"top-1 differs on prompts {differs.nonzero().flatten().tolist()}"
