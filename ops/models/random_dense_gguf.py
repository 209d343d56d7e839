"""A random Gemma 3, Gemma 2 or Phi-3 of realistic proportions as a GGUF llama.cpp loads, for speed runs.

    .venv/bin/python -m pagedserve.ops.models.random_dense_gguf gemma3 Q4_0 [--out FOLDER]

The speed comparison with llama.cpp needs one file both sides load, and no Gemma or Phi GGUF can be
downloaded here. The shapes are the published models' scaled down to a few hundred MB (fewer layers,
the bundled SmolLM2 vocabulary of 49152 tokens):

- gemma3: Gemma 3 1B's layer (hidden 1152, 4 query heads / 1 KV head of 256, feed-forward 6912, q/k
  norms, window 512 on 5 layers of 6, local rotary base 10000, global 1e6), 12 layers, tied embedding;
- gemma2: Gemma 2 2B's layer (hidden 2304, 8 / 4 heads of 256, feed-forward 9216, window 4096 every
  other layer, soft-caps 50 / 30), 6 layers, tied embedding;
- phi3: Phi-4-mini's layer (hidden 3072, 24 / 8 heads of 128, feed-forward 8192, 3/4 of each head
  rotated, LongRoPE factors with an original context of 4096), 4 layers, untied head.

The metadata keys and tensor names are those llama.cpp's converter writes for the architecture
(services/gguf_gemma_phi.py reads them), the tokenizer's metadata (chat template included) is copied
from the bundled GGUF. Weights are N(0, 0.02), norms 1 + N(0, 0.02) (a Gemma file stores 1 + w): the
speed does not depend on the values. Matrices and the embedding are quantized by the `gguf` package
(Q8_0, Q4_0, Q4_1), norms and LongRoPE factors F32. The output is a folder holding just the .gguf
(default `$PAGEDSERVE_CACHE/random-<family>-<type>`): `pagedserve serve FOLDER` and the bench's
llama.cpp peer both take it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True, slots=True)
class Shape:
    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ff: int
    context: int = 8192
    window: int = 0
    tied: bool = True
    rotary: int = 0  # Phi-3: rotated dimensions per head (0: all)


SHAPES = {
    "gemma3": Shape("gemma3", 1152, 12, 4, 1, 256, 6912, window=512),
    "gemma2": Shape("gemma2", 2304, 6, 8, 4, 256, 9216, window=4096),
    "phi3": Shape("phi3", 3072, 4, 24, 8, 128, 8192, context=131072, tied=False, rotary=96),
}
TYPES = ("Q8_0", "Q4_0", "Q4_1")


def _metadata(writer, shape: Shape) -> None:
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    if shape.arch.startswith("gemma"):
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
        writer.add_sliding_window(shape.window)
    if shape.arch == "gemma2":
        writer.add_attn_logit_softcapping(50.0)
        writer.add_final_logit_softcapping(30.0)
    if shape.arch == "gemma3":
        writer.add_rope_freq_base(1_000_000.0)
        writer.add_rope_freq_base_swa(10_000.0)
    if shape.arch == "phi3":
        writer.add_rope_freq_base(10_000.0)
        writer.add_rope_dimension_count(shape.rotary)
        writer.add_rope_scaling_orig_ctx_len(4096)
        scale = shape.context / 4096
        writer.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(scale) / np.log(4096))))
        writer.add_sliding_window(0)


def _tensors(shape: Shape, vocab: int, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 values), one at a time (the whole model never in memory)."""
    rng = np.random.default_rng(seed)

    def normal(*dims: int) -> np.ndarray:
        return rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)

    def norm(n: int) -> np.ndarray:
        return np.float32(1.0) + normal(n)

    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    yield "token_embd.weight", normal(vocab, shape.hidden)
    if shape.arch == "phi3":
        half = shape.rotary // 2
        yield "rope_factors_long.weight", np.linspace(1.0, 40.0, half, dtype=np.float32)
        yield "rope_factors_short.weight", np.linspace(1.0, 1.5, half, dtype=np.float32)
    for i in range(shape.layers):
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", norm(shape.hidden)
        if shape.arch == "phi3":
            yield f"{b}.attn_qkv.weight", normal(q + 2 * kv, shape.hidden)
            yield f"{b}.attn_output.weight", normal(shape.hidden, q)
            yield f"{b}.ffn_norm.weight", norm(shape.hidden)
            yield f"{b}.ffn_up.weight", normal(2 * shape.ff, shape.hidden)  # [gate | up]
            yield f"{b}.ffn_down.weight", normal(shape.hidden, shape.ff)
            continue
        yield f"{b}.attn_q.weight", normal(q, shape.hidden)
        yield f"{b}.attn_k.weight", normal(kv, shape.hidden)
        yield f"{b}.attn_v.weight", normal(kv, shape.hidden)
        if shape.arch == "gemma3":
            yield f"{b}.attn_q_norm.weight", norm(shape.head_dim)
            yield f"{b}.attn_k_norm.weight", norm(shape.head_dim)
        yield f"{b}.attn_output.weight", normal(shape.hidden, q)
        yield f"{b}.post_attention_norm.weight", norm(shape.hidden)
        yield f"{b}.ffn_norm.weight", norm(shape.hidden)
        yield f"{b}.ffn_gate.weight", normal(shape.ff, shape.hidden)
        yield f"{b}.ffn_up.weight", normal(shape.ff, shape.hidden)
        yield f"{b}.ffn_down.weight", normal(shape.hidden, shape.ff)
        yield f"{b}.post_ffw_norm.weight", norm(shape.hidden)
    yield "output_norm.weight", norm(shape.hidden)
    if not shape.tied:
        yield "output.weight", normal(vocab, shape.hidden)


def write_gguf(path: Path, shape: Shape, type_name: str, seed: int = 0) -> Path:
    import gguf

    from pagedserve.services.worker.weights.bundled import find_bundled_gguf

    reader = gguf.GGUFReader(find_bundled_gguf())
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    writer = gguf.GGUFWriter(path, shape.arch, use_temp_file=True)  # tensors spill to disk, not memory
    # llama.cpp treats a vocabulary as Phi-3's SentencePiece one (and looks up "</s>") when the model's
    # name holds "phi3": the Phi-4-mini-shaped model with the bundled tokenizer is named for Phi-4.
    writer.add_name("random-" + {"phi3": "phi4-mini"}.get(shape.arch, shape.arch))
    _metadata(writer, shape)
    writer.add_file_type(int(gguf.LlamaFileType[f"MOSTLY_{type_name}"]))
    for field in reader.fields.values():
        if field.name.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    kind = gguf.GGMLQuantizationType[type_name]
    for name, values in _tensors(shape, vocab, seed):
        if values.ndim == 1:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main() -> None:
    from pagedserve.services.model_cache import publish_atomically
    from pagedserve.services.worker.weights.bundled import cache_root

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=sorted(SHAPES))
    parser.add_argument("type", choices=TYPES)
    parser.add_argument("--out", type=Path, help="default: $PAGEDSERVE_CACHE/random-<family>-<type>")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = args.out or cache_root() / f"random-{args.family}-{args.type.lower()}"
    if out.exists():
        raise SystemExit(f"{out} exists; delete it to make it again")
    out.parent.mkdir(parents=True, exist_ok=True)
    name = f"random-{args.family}.{args.type}.gguf"
    publish_atomically(
        out, lambda folder: write_gguf(folder / name, SHAPES[args.family], args.type, args.seed)
    )
    print(out / name)


if __name__ == "__main__":
    main()
