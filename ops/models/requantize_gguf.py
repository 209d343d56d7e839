"""The bundled SmolLM2 GGUF requantized into another type: a .gguf file any command takes as --model.

    .venv/bin/python -m pagedserve.ops.models.requantize_gguf Q8_0 [--out FILE.gguf]
    .venv/bin/python -m pagedserve.ops.models.requantize_gguf Q4_K_M [--llama-cpp VENV]

Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: every quantized tensor of the bundled Q4_1 file (its Q8_0 embedding too)
is dequantized and quantized again into the type (the `gguf` package's quantizer); the F32 norms and
every metadata field (the tokenizer, the chat template) are copied, `general.file_type` set to the new
type. Rows are quantized in the file's own order: a block never spans two rows, so llama.cpp's q/k row
order needs no undoing.

Q4_K_M, Q5_K_M: llama.cpp's own presets, made by llama.cpp's quantizer (`llama_model_quantize`, what
`llama-quantize` runs) from the peer venv (ops/peers/setup_llamacpp.sh; default LLAMACPP_VENV, else
.venv-llamacpp at the repo root): its mix of types per tensor, as users download them. SmolLM2's rows of
576 weights are not whole 256-weight super-blocks, so llama.cpp falls back to its 32-block types for
those (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0) and keeps K-quants where the rows allow (ffn_down's
1536): the file holds Q5_0, Q8_0, Q4_K and Q6_K (Q4_K_M).

The file (default `$PAGEDSERVE_CACHE/smollm2-135m-<type>.gguf`, not in git) is a model by itself, as
the bundled one is: `--quantization none` on it is the dequantize-then-float32 reference of
`--quantization gguf`. Requantizing Q4_1 values to Q8_0 rounds them once more (to 1/127 of each 32
weights' largest magnitude): the model is close to the bundled one, not equal to it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

TYPES = {
    "Q8_0": "MOSTLY_Q8_0",
    "Q4_0": "MOSTLY_Q4_0",
    "Q4_1": "MOSTLY_Q4_1",
    "Q5_0": "MOSTLY_Q5_0",
    "Q5_1": "MOSTLY_Q5_1",
}  # the gguf package quantizes these
PRESETS = {"Q4_K_M": 15, "Q5_K_M": 17}  # llama.cpp's LLAMA_FTYPE_MOSTLY_*: its quantizer makes these


def requantize(source: Path, destination: Path, type_name: str) -> None:
    """Write `destination` (a .gguf) with `source`'s quantized tensors in `type_name`."""
    import gguf

    kind = gguf.GGMLQuantizationType[type_name]
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(destination, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        if field.name == gguf.Keys.General.FILE_TYPE:
            continue  # the new type's, below
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_file_type(int(gguf.LlamaFileType[TYPES[type_name]]))
    for tensor in reader.tensors:
        if tensor.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(tensor.name, np.array(tensor.data))
            continue
        dense = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, gguf.quants.quantize(dense, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llamacpp_quantize(source: Path, destination: Path, preset: str, venv: Path) -> None:
    """Write `destination` with llama.cpp's quantizer (the peer venv's), preset Q4_K_M or Q5_K_M."""
    import subprocess

    python = venv / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"no llama.cpp venv at {venv}: run ops/peers/setup_llamacpp.sh")
    script = (
        "import ctypes, sys, llama_cpp as lc\n"
        "p = lc.llama_model_quantize_default_params()\n"
        "p.ftype, p.allow_requantize, p.nthread = int(sys.argv[3]), True, 2\n"
        "sys.exit(lc.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))\n"
    )
    argv = [str(python), "-c", script, str(source), str(destination), str(PRESETS[preset])]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0 or not destination.exists():
        raise RuntimeError(f"llama.cpp could not quantize {source} to {preset}: {done.stderr[-2000:]}")


def dequantized_checkpoint(gguf_file: Path) -> dict[str, object]:
    """The GGUF's tensors as float32 torch tensors, in Hugging Face's names and q/k row order."""
    import gguf
    import torch

    from pagedserve.services.worker.weights.gguf_weights import hf_name, qk_row_order

    reader = gguf.GGUFReader(gguf_file)
    heads = int(reader.fields["llama.attention.head_count"].contents())
    kv_heads = int(reader.fields["llama.attention.head_count_kv"].contents())
    out = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        dense = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        # A llama file: the head counts above are read from its llama.* keys.
        order = qk_row_order("llama", name, dense.shape[0], heads, kv_heads)
        if order is not None:
            dense = dense[order]
        out[name] = torch.from_numpy(np.ascontiguousarray(dense))
    return out


def make_file(type_name: str, out: Path, llamacpp: Path | None = None) -> Path:
    """The requantized bundled model at `out`, written whole or not at all."""
    import os
    import tempfile

    from pagedserve.services.worker.weights.bundled import find_bundled_gguf

    if out.exists():
        raise FileExistsError(f"{out} exists; delete it to make it again")
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    os.close(handle)
    try:
        if type_name in PRESETS:
            Path(staging).unlink()  # llama.cpp writes the file itself
            llamacpp_quantize(
                find_bundled_gguf(), Path(staging), type_name, llamacpp or Path(".venv-llamacpp")
            )
        else:
            requantize(find_bundled_gguf(), Path(staging), type_name)
        os.chmod(staging, 0o644)
        os.replace(staging, out)  # atomic: the file is whole or absent
    finally:
        Path(staging).unlink(missing_ok=True)
    return out


def main() -> None:
    from pagedserve.ops.bench.llamacpp_server import llamacpp_venv
    from pagedserve.services.worker.weights.bundled import cache_root

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("type", choices=sorted(TYPES) + sorted(PRESETS))
    parser.add_argument("--out", type=Path, help="default: $PAGEDSERVE_CACHE/smollm2-135m-<type>.gguf")
    parser.add_argument(
        "--llama-cpp", type=Path, help="Q4_K_M/Q5_K_M: llama.cpp's venv (default as the bench's)"
    )
    args = parser.parse_args()
    out = args.out or cache_root() / f"smollm2-135m-{args.type.lower()}.gguf"
    print(make_file(args.type, out, args.llama_cpp or llamacpp_venv()))


if __name__ == "__main__":
    main()
