"""Put a GGUF's quantized weights into a model built on the meta device, before its dense weights exist.

Each projection (and the embedding, and an untied LM head) whose checkpoint tensors are all of types
the kernel runs becomes a QuantLinear / QuantEmbedding over the stored blocks. Fused projections
(q/k/v, gate/up) concatenate their parts' rows, which is exact: a row is a whole run of blocks; parts of
different types (a Q4_K_M file's Q4_K q and k beside its Q6_K v) stay in their own types, one kernel
call each. A projection left dense (a type the kernel lacks, a bias) is filled from the checkpoint
folder like any other weight. A tied LM head shares the embedding's blocks.

A mixture-of-experts layer's experts (one 3-D GGUF tensor per projection, every expert's rows one
after the other) become QuantExpertLinears: gate and up of a type are interleaved per expert into one
fused [num_experts * 2I] run of rows, down is kept as stored. The router stays dense (layers/moe.py's
Router is no nn.Linear, so nothing here takes it).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from pagedserve.services.worker.layers.moe import ExpertLinear, Experts, QuantExpertLinear
from pagedserve.services.worker.layers.quant_linear import (
    QuantEmbedding,
    QuantLinear,
    QuantTensor,
    activation_mode,
    quant_ops,
)
from pagedserve.services.worker.models.llama import LlamaForCausalLM
from pagedserve.services.worker.models.moe import MoeForCausalLM


def install_quantized(
    model: LlamaForCausalLM,
    tensors: dict[str, QuantTensor],
    *,
    keep_bias: bool = False,
    activations: str | None = None,
) -> set[str]:
    """Replace what `tensors` holds quantized (a GGUF's, or a GPTQ/AWQ/compressed-tensors checkpoint's
    repacked); -> the checkpoint names now held that way (the loader skips them in the folder).
    keep_bias: a projection with a bias is quantized too, its bias a float32 parameter the loader
    fills (the kernel adds it); else it stays dense. activations: quant_activations (None: from the
    environment)."""
    ops = quant_ops()
    mode = activation_mode(activations)
    installed: set[str] = set()
    split = {v: k for k, v in model.fused_projections.items()}  # (fused, shard) -> checkpoint part

    for module_name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear) or (child.bias is not None and not keep_bias):
                continue
            path = f"{module_name}.{child_name}" if module_name else child_name
            prefix = "" if path == "lm_head" else "model."
            if (child_name, 0) in split:  # the checkpoint stores it in parts (q/k/v, gate/up)
                shards = 3 if child_name == "qkv_proj" else 2
                names = [f"{prefix}{module_name}.{split[(child_name, i)]}.weight" for i in range(shards)]
            else:
                names = [f"{prefix}{path}.weight"]
            parts = [p for n in names if isinstance(p := tensors.get(n), QuantTensor)]
            if len(parts) != len(names):
                continue
            if not _same_order([p.input_order for p in parts]):
                continue  # parts that read their inputs in different orders cannot share one input
            shape = (sum(p.out_features for p in parts), parts[0].in_features)
            if shape != (child.out_features, child.in_features) or len({p.in_features for p in parts}) != 1:
                raise ValueError(
                    f"quantized tensors {', '.join(names)} make a [{shape[0]} x {shape[1]}] weight, "
                    f"the model's {path} is [{child.out_features} x {child.in_features}]"
                )
            # Parts of different types (Q4_K q and k beside a Q6_K v) stay so: one kernel call per run
            # of a type. Copies: the parts may be views of the mapped GGUF file (read_gguf).
            parts = [replace(p, blocks=p.blocks.clone()) for p in parts]
            bias = None
            if child.bias is not None:
                bias = nn.Parameter(torch.empty(child.out_features, device="meta"), requires_grad=False)
            setattr(module, child_name, QuantLinear(parts, bias, ops, mode))
            installed.update(names)

    for path, module in list(model.named_modules()):
        if isinstance(module, Experts):
            assert isinstance(model, MoeForCausalLM)  # experts live only in the MoE architectures
            installed |= _install_experts(model, path, module, tensors, ops, mode)

    embedding = tensors.get("model.embed_tokens.weight")
    if isinstance(embedding, QuantTensor):
        owned = QuantTensor(embedding.type_name, embedding.blocks.clone(), embedding.in_features)
        model.embed_tokens = QuantEmbedding(owned, ops, mode)
        installed.add("model.embed_tokens.weight")
        if model.lm_head is None:
            model.tied_head = model.embed_tokens.as_linear()
    return installed


def _same_order(orders: list[torch.Tensor | None]) -> bool:
    first = orders[0]
    if first is None:
        return all(o is None for o in orders)
    return all(o is not None and torch.equal(o, first) for o in orders)


def _install_experts(
    model: MoeForCausalLM, path: str, experts: Experts, tensors: dict[str, QuantTensor], ops, mode: int
) -> set[str]:
    """The quantized projections of one layer's experts (`path`: layers.N.mlp.experts) -> the
    checkpoint names now held quantized. A projection whose tensors are missing or not kernel types
    stays dense (the folder fills it)."""
    layer = int(path.split(".")[1])
    count = experts.num_experts
    gate, up, down = (tensors.get(f"model.{path}.{p}.weight") for p in ("gate_proj", "up_proj", "down_proj"))
    installed: set[str] = set()
    if isinstance(gate, QuantTensor) and isinstance(up, QuantTensor) and gate.type_name == up.type_name:
        # expert e's gate rows, then its up rows: [E, I, bytes] twice -> [E, 2I, bytes] (a copy, so the
        # mapped file is not kept alive)
        per_expert = [t.blocks.reshape(count, -1, t.blocks.shape[1]) for t in (gate, up)]
        blocks = torch.cat(per_expert, dim=1).reshape(-1, gate.blocks.shape[1])
        fused = QuantTensor(gate.type_name, blocks, gate.in_features, gate.source)
        _check_shape(fused, experts.gate_up_proj, count, path + ".gate_up_proj")
        experts.gate_up_proj = QuantExpertLinear(fused, count, ops, mode)
        for part in ("gate_proj", "up_proj"):  # per expert, and the whole layer's 3-D form
            installed.update((*model.expert_checkpoint_names(layer, part), f"model.{path}.{part}.weight"))
    if isinstance(down, QuantTensor):
        owned = QuantTensor(down.type_name, down.blocks.clone(), down.in_features, down.source)
        _check_shape(owned, experts.down_proj, count, path + ".down_proj")
        experts.down_proj = QuantExpertLinear(owned, count, ops, mode)
        installed.update(
            (*model.expert_checkpoint_names(layer, "down_proj"), f"model.{path}.down_proj.weight")
        )
    return installed


def _check_shape(weight: QuantTensor, dense: nn.Module, count: int, path: str) -> None:
    if not isinstance(dense, ExpertLinear):  # installed once, over the dense experts the model built
        raise TypeError(f"{path} is a {type(dense).__name__}, not the dense experts to quantize")
    want = (count * dense.out_features, dense.in_features)
    if (weight.out_features, weight.in_features) != want:
        raise ValueError(
            f"quantized experts {path} are [{weight.out_features} x {weight.in_features}], the model's "
            f"{count} experts make [{want[0]} x {want[1]}]"
        )
