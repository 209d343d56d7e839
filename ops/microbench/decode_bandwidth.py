"""How close a decode step comes to the machine's memory bandwidth: the weight bytes one step reads, and
what this machine reads per second on the same threads.

A decode step reads every weight it uses once, whatever its batch: the linears (q/k/v, o, the MLP), the
norms and the LM head; of an embedding table only its rows (counted as nothing, unless the head is that
table); of a MoE layer's experts, at one token, its top-k of them (`top_k / num_experts` of their bytes,
the share one token reads). The machine's figure is a `torch.sum` over 512 MiB of float32, the median of
5 passes on the given threads: a plain streaming read, the most the step's reads could reach.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from pagedserve.services.worker.layers.moe import SparseMoeBlock
from pagedserve.services.worker.layers.packed_linear import PackedLinear
from pagedserve.services.worker.layers.quant_linear import QuantLinear

PROBE_BYTES = 512 << 20


def read_bandwidth(threads: int) -> float:
    """Bytes per second a `torch.sum` over 512 MiB reads on `threads` threads (median of 5 passes)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        data = torch.ones(PROBE_BYTES // 4, dtype=torch.float32)
        data.sum()  # pages touched, threads up
        times = []
        for _ in range(5):
            start = time.perf_counter()
            data.sum()
            times.append(time.perf_counter() - start)
        return PROBE_BYTES / statistics.median(times)
    finally:
        torch.set_num_threads(before)


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    """The weights a module holds itself: its parameters, its GGML blocks and its oneDNN-packed weight
    (plain attributes)."""
    tensors = list(module.parameters(recurse=False))
    if isinstance(module, PackedLinear):
        tensors += [t for t in (module.packed_weight, module.bias) if t is not None]
    elif isinstance(module, QuantLinear):
        tensors += [blocks for _, blocks, _ in module.runs]
    elif isinstance(blocks := getattr(module, "blocks", None), torch.Tensor):
        tensors.append(blocks)
    return tensors


def _key(tensor: torch.Tensor) -> int:
    """Its memory's address (a tensor and a view of it are one weight); an opaque oneDNN one has none."""
    return id(tensor) if tensor.is_mkldnn else tensor.data_ptr()


def weight_bytes_per_token(model: nn.Module) -> int:
    """The weight bytes one decode step of one request reads (see the module's docstring)."""
    share: dict[int, float] = {}  # data_ptr -> the share of it one token reads
    embedding = getattr(model, "embed_tokens", None)
    head_reads_table = getattr(model, "lm_head", None) is None and getattr(model, "tied_head", None) is None
    for module in model.modules():
        if isinstance(module, SparseMoeBlock):
            for part in (module.experts.gate_up_proj, module.experts.down_proj):
                for tensor in _tensors(part):
                    share[_key(tensor)] = module.top_k / module.experts.num_experts
    total = 0.0
    seen: set[int] = set()
    for module in model.modules():
        if module is embedding and not head_reads_table:
            continue  # rows only: the head is another tensor, or a linear over these blocks counted there
        for tensor in _tensors(module):
            key = _key(tensor)
            if key in seen or tensor.device.type == "meta":
                continue
            seen.add(key)
            total += tensor.numel() * tensor.element_size() * share.get(key, 1.0)
    return int(total)
