"""The bundled SmolLM2 GGUF requantized into another type: a .gguf file any command takes as --model.

    .venv/bin/python -m pagedserve.ops.models.requantize_gguf Q8_0 [--out FILE.gguf]

Every quantized tensor of the bundled Q4_1 file (its Q8_0 embedding too) is dequantized and quantized
again into the type (the `gguf` package's quantizer); the F32 norms and every metadata field (the
tokenizer, the chat template) are copied, `general.file_type` set to the new type. Rows are quantized
in the file's own order: a block never spans two rows, so llama.cpp's q/k row order needs no undoing.

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
}  # the gguf package quantizes these


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


def dequantized_checkpoint(gguf_file: Path) -> dict[str, object]:
    """The GGUF's tensors as float32 torch tensors, in Hugging Face's names and q/k row order."""
    import gguf
    import torch
    from pagedserve.services.worker.weights.gguf_weights import _unpermute_rows, hf_name

    reader = gguf.GGUFReader(gguf_file)
    heads = int(reader.fields["llama.attention.head_count"].contents())
    kv_heads = int(reader.fields["llama.attention.head_count_kv"].contents())
    out = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        dense = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if ".q_proj." in name or ".k_proj." in name:
            dense = dense[_unpermute_rows(dense.shape[0], heads if ".q_proj." in name else kv_heads)]
        out[name] = torch.from_numpy(np.ascontiguousarray(dense))
    return out


def make_file(type_name: str, out: Path) -> Path:
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
        requantize(find_bundled_gguf(), Path(staging), type_name)
        os.chmod(staging, 0o644)
        os.replace(staging, out)  # atomic: the file is whole or absent
    finally:
        Path(staging).unlink(missing_ok=True)
    return out


def main() -> None:
    from pagedserve.services.worker.weights.bundled import cache_root

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("type", choices=sorted(TYPES))
    parser.add_argument("--out", type=Path, help="default: $PAGEDSERVE_CACHE/smollm2-135m-<type>.gguf")
    args = parser.parse_args()
    out = args.out or cache_root() / f"smollm2-135m-{args.type.lower()}.gguf"
    print(make_file(args.type, out))


if __name__ == "__main__":
    main()
