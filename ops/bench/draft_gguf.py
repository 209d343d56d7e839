"""A draft model cut from a GGUF: its first N transformer blocks, its embedding, final norm and head.

    python -m pagedserve.ops.bench.draft_gguf smollm2-135m /tmp/draft-10.gguf --layers 10

The bundled SmolLM2-135M is the smallest of its family, so no smaller checkpoint shares its tokenizer;
its own first layers (an early exit) are the draft the speculative bench can run on this machine. The
file keeps every metadata field (tokenizer, chat template) but the block count, and the tensors in
their stored types, so it loads like any GGUF (`{"model": "/tmp/draft-10.gguf"}`).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import gguf

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def cut(source: Path, target: Path, layers: int) -> int:
    """Write `target` with the first `layers` blocks of `source` -> how many tensors it holds."""
    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    count_key = f"{arch}.block_count"
    total = reader.get_field(count_key).contents()
    if not 1 <= layers <= total:
        raise ValueError(f"--layers must be in [1, {total}] for {source.name}; got {layers}")
    writer = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer adds these itself
        kind = field.types[0]
        value = layers if field.name == count_key else field.contents()
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    kept = [t for t in reader.tensors if (m := _BLOCK.match(t.name)) is None or int(m.group(1)) < layers]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return len(kept)


def main(argv: list[str] | None = None) -> int:
    from pagedserve.services.checkpoint import resolve_model

    ap = argparse.ArgumentParser(prog="python -m pagedserve.ops.bench.draft_gguf", description=__doc__)
    ap.add_argument("model", help="a .gguf, or a name resolving to one (smollm2-135m)")
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, required=True)
    args = ap.parse_args(argv)
    n = cut(resolve_model(args.model), args.out, args.layers)
    print(f"{args.out}: {args.layers} blocks, {n} tensors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
