"""A random Qwen3-MoE of realistic proportions as a GGUF llama.cpp loads, and a checkpoint folder around it.

    .venv/bin/python -m pagedserve.ops.models.random_moe_gguf Q4_K_M [--llamacpp-venv /work/main/.venv-llamacpp]

The speed comparison with llama.cpp on a MoE needs one file both sides load, and no MoE GGUF can be
downloaded here. The default shape is Qwen3-30B-A3B's scaled to ~1.0B parameters: hidden 1024,
16 layers, 16 query / 4 KV heads of 128, 32 experts of 512, top-4 (every token reads about a quarter of
the weights: 4 of 32 experts, the attention, the LM head), vocabulary and tokenizer the bundled
SmolLM2's (its metadata copied from the bundled GGUF, chat template included), untied LM head,
`norm_topk_prob` on (llama.cpp renormalises qwen3moe's top-k always). Weights are N(0, 0.02), norms 1:
the speed does not depend on the values, and the routing of random weights is near uniform.

Written in two steps: an F16 GGUF (norms and routers F32, as llama.cpp's converter writes them), then
quantized: Q8_0, Q4_0 and Q4_1 by the `gguf` package here; any llama.cpp file type (Q4_K_M, Q5_K_M,
Q6_K...) by llama.cpp's own quantizer (`llama_model_quantize`, the C API of llama-quantize) run in
the llama-cpp-python venv. The folder (default `$PAGEDSERVE_CACHE/random-moe-1b-<type>`) holds the
GGUF, a config.json saying the same shapes, the bundled tokenizer files, and a `model.safetensors`
with the float32 tensors (norms, routers, and the dequantized values of any tensor of a type our kernel
does not run) for a folder load: it serves the GGUF's quantized weights (`--quantization gguf` or
`auto`), not a dense load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

GGUF_PACKAGE_TYPES = ("Q8_0", "Q4_0", "Q4_1")


@dataclass(frozen=True, slots=True)
class Shape:
    hidden: int = 1024
    layers: int = 16
    heads: int = 16
    kv_heads: int = 4
    head_dim: int = 128
    experts: int = 32
    top_k: int = 4
    expert_size: int = 512
    context: int = 8192
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    std: float = 0.02  # of the weights' normal draws (larger: more peaked next-token distributions)


def config_json(shape: Shape, vocab: int, bos: int, eos: int) -> dict:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.expert_size,
        "moe_intermediate_size": shape.expert_size,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "num_experts": shape.experts,
        "num_experts_per_tok": shape.top_k,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "max_position_embeddings": shape.context,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": shape.rms_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }


def tensors(shape: Shape, vocab: int, seed: int):
    """(GGUF name, float32 values) of every tensor, one at a time (the whole model never in memory)."""
    rng = np.random.default_rng(seed)

    def normal(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * shape.std).astype(np.float32)

    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    yield "token_embd.weight", normal(vocab, shape.hidden)
    for i in range(shape.layers):
        yield f"blk.{i}.attn_norm.weight", np.ones(shape.hidden, np.float32)
        yield f"blk.{i}.attn_q.weight", normal(q, shape.hidden)
        yield f"blk.{i}.attn_k.weight", normal(kv, shape.hidden)
        yield f"blk.{i}.attn_v.weight", normal(kv, shape.hidden)
        yield f"blk.{i}.attn_output.weight", normal(shape.hidden, q)
        yield f"blk.{i}.attn_q_norm.weight", np.ones(shape.head_dim, np.float32)
        yield f"blk.{i}.attn_k_norm.weight", np.ones(shape.head_dim, np.float32)
        yield f"blk.{i}.ffn_norm.weight", np.ones(shape.hidden, np.float32)
        yield f"blk.{i}.ffn_gate_inp.weight", normal(shape.experts, shape.hidden)
        yield f"blk.{i}.ffn_gate_exps.weight", normal(shape.experts, shape.expert_size, shape.hidden)
        yield f"blk.{i}.ffn_up_exps.weight", normal(shape.experts, shape.expert_size, shape.hidden)
        yield f"blk.{i}.ffn_down_exps.weight", normal(shape.experts, shape.hidden, shape.expert_size)
    yield "output_norm.weight", np.ones(shape.hidden, np.float32)
    yield "output.weight", normal(vocab, shape.hidden)


def _kept_float32(name: str) -> bool:
    """Norms and routers: float32 in llama.cpp's files, never quantized."""
    return name.endswith("norm.weight") or ".ffn_gate_inp." in name


def write_gguf(path: Path, shape: Shape, tokenizer_source: Path, type_name: str, seed: int) -> dict:
    """Write the model as a GGUF in F16 (`type_name` "F16") or a type the gguf package quantizes;
    -> the float32 tensors, by Hugging Face name (for the folder's safetensors)."""
    import gguf

    reader = gguf.GGUFReader(tokenizer_source)
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    arch = "qwen3moe"
    writer = gguf.GGUFWriter(path, arch, use_temp_file=True)  # tensors spill to disk, not memory
    writer.add_name("random-moe-1b")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.expert_size)
    writer.add_expert_feed_forward_length(shape.expert_size)
    writer.add_expert_count(shape.experts)
    writer.add_expert_used_count(shape.top_k)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_rope_freq_base(shape.rope_theta)
    file_types = {"F16": "MOSTLY_F16", "Q8_0": "MOSTLY_Q8_0", "Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1"}
    writer.add_file_type(int(gguf.LlamaFileType[file_types[type_name]]))
    for field in reader.fields.values():
        if field.name.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    from pagedserve.services.worker.weights.gguf_weights import hf_name

    dense: dict[str, np.ndarray] = {}
    kind = gguf.GGMLQuantizationType[type_name]
    for name, values in tensors(shape, vocab, seed):
        if _kept_float32(name):
            writer.add_tensor(name, values)
            dense[hf_name(name) or name] = values
        elif type_name == "F16":
            writer.add_tensor(name, values.astype(np.float16))
        else:
            blocks = gguf.quants.quantize(values.reshape(-1, values.shape[-1]), kind)
            writer.add_tensor(name, blocks.reshape(*values.shape[:-1], -1), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dense


# Tensors our loader fuses into one projection: one of a type the kernel lacks leaves all of them dense.
FUSED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate_exps", "ffn_up_exps"))


def kernel_less_tensors(path: Path) -> dict[str, np.ndarray]:
    """The quantized tensors our loader keeps dense (a type the kernel does not run, such as Q6_K in a
    Q4_K_M file until it does, or a fused projection's part beside such a tensor), dequantized to
    float32 by Hugging Face name: a folder load takes them from the safetensors."""
    import gguf

    from pagedserve.services.worker.layers.quant_linear import KERNEL_TYPES
    from pagedserve.services.worker.weights.gguf_weights import hf_name

    floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors if t.tensor_type not in floats}
    dense = {name for name, t in tensors.items() if t.tensor_type.name not in KERNEL_TYPES}
    for name in list(dense):
        block, _, rest = name.rpartition(".")[0].rpartition(".")
        for group in FUSED:
            if rest in group:
                dense.update(
                    f"{block}.{part}.weight" for part in group if f"{block}.{part}.weight" in tensors
                )
    out = {}
    for name in sorted(dense):
        values = gguf.quants.dequantize(tensors[name].data, tensors[name].tensor_type).astype(np.float32)
        out[hf_name(name) or name] = values
    return out


LLAMACPP_QUANTIZE = """
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
params.nthread = 2
rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params)
sys.exit(rc)
"""


def make_folder(type_name: str, out: Path, shape: Shape, llamacpp_venv: Path | None, seed: int = 0) -> Path:
    from safetensors.numpy import save_file

    from pagedserve.services.checkpoint import load_tokenizer, read_checkpoint
    from pagedserve.services.model_cache import publish_atomically
    from pagedserve.services.worker.weights.bundled import find_bundled_gguf

    source = find_bundled_gguf()
    if out.exists():
        raise FileExistsError(f"{out} exists; delete it to make it again")
    out.parent.mkdir(parents=True, exist_ok=True)
    # The bundled model is its GGUF: its config and tokenizer are read from the file.
    bundled_config = read_checkpoint(source).config
    bundled_tokenizer = load_tokenizer(source)

    def write(folder: Path) -> None:
        gguf_file = folder / f"random-moe-1b.{type_name}.gguf"
        if type_name in GGUF_PACKAGE_TYPES:
            dense = write_gguf(gguf_file, shape, source, type_name, seed)
        else:
            if llamacpp_venv is None:
                raise ValueError(f"{type_name} is quantized by llama.cpp: pass --llamacpp-venv")
            with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
                f16 = Path(tmp) / "model.F16.gguf"
                dense = write_gguf(f16, shape, source, "F16", seed)
                python = llamacpp_venv / "bin" / "python"
                command = [str(python), "-c", LLAMACPP_QUANTIZE, str(f16), str(gguf_file), type_name]
                subprocess.run(command, check=True)
            dense |= kernel_less_tensors(gguf_file)
        bundled_tokenizer.save_pretrained(str(folder))
        vocab = bundled_config["vocab_size"]
        config = config_json(shape, vocab, bundled_config["bos_token_id"], bundled_config["eos_token_id"])
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        save_file({k: np.ascontiguousarray(v) for k, v in dense.items()}, str(folder / "model.safetensors"))
        note = {"type": type_name, "gguf": gguf_file.name, "seed": seed, "shape": asdict(shape)}
        (folder / "pagedserve_random_moe.json").write_text(json.dumps(note, indent=2))

    publish_atomically(out, write)
    return out


def main() -> None:
    from pagedserve.services.worker.weights.bundled import cache_root

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "type", help="Q8_0, Q4_0, Q4_1 (the gguf package), or a llama.cpp file type: Q4_K_M..."
    )
    parser.add_argument("--out", type=Path, help="default: $PAGEDSERVE_CACHE/random-moe-1b-<type>")
    parser.add_argument(
        "--llamacpp-venv", type=Path, help="the llama-cpp-python venv (llama.cpp's quantizer)"
    )
    parser.add_argument("--seed", type=int, default=0)
    for field, default in asdict(Shape()).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(default), default=default)
    args = parser.parse_args()
    shape = Shape(**{f: getattr(args, f) for f in asdict(Shape())})
    out = args.out or cache_root() / f"random-moe-1b-{args.type.lower()}"
    print(make_folder(args.type, out, shape, args.llamacpp_venv, args.seed))


if __name__ == "__main__":
    main()
