"""Which of a GGUF's weight matrices stay in their stored blocks, and what is said about the rest.

A matrix in a type the quantized kernel runs (layers/quant_linear.py KERNEL_TYPES) stays packed. Any
other quantized matrix (IQ2_XXS, TQ1_0, ... or F16 rows that are not whole groups of 32) costs float32
memory and 4 bytes read per weight per step once dequantized, several times what the file stores:
`--quantization gguf` refuses such a file, naming each such tensor and its type; `auto` dequantizes
them (logged, with the same names). F32 matrices are float32 as stored: nothing is lost keeping them
so. A type that nothing here reads (a type id newer than the `gguf` package, or one its dequantizer
lacks) is refused either way, by name: it would otherwise fail deep in a dequantizer, or be read wrong.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pagedserve.services.worker.layers.quant_linear import KERNEL_TYPES, runs_packed


@dataclass(frozen=True, slots=True)
class Unpacked:
    """A weight matrix that will not stay in its stored blocks."""

    tensor: str  # the GGUF's name: blk.3.attn_q.weight
    type_name: str  # IQ2_XXS, or `type id 42` for one the gguf package does not know
    dequantizable: bool  # the gguf package's dequantizer reads it


def type_name(type_id: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type id {type_id}"


def dequantizable(name: str) -> bool:
    """Whether the gguf package reads this type into float values (the dense path)."""
    import numpy as np
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    if name in ("F32", "F16", "BF16"):
        return True
    kind = GGMLQuantizationType.__members__.get(name)
    if kind is None or kind not in GGML_QUANT_SIZES:
        return False
    try:  # one all-zero block: the package raises NotImplementedError for a type it cannot read
        dequantize(np.zeros((1, GGML_QUANT_SIZES[kind][1]), dtype=np.uint8), kind)
    except NotImplementedError:
        return False
    return True


def unpacked_matrices(tensors: Iterable[tuple[str, int, tuple[int, ...]]]) -> list[Unpacked]:
    """(GGUF name, type id, dims in ggml order) of a model's weights -> the matrices (2-D and up) that
    will not stay packed, F32 ones aside. Vectors (norms, biases) are dense whatever their type."""
    out = []
    for tensor, type_id, dims in tensors:
        name = type_name(type_id)
        if len(dims) < 2 or name == "F32" or runs_packed(name, dims):
            continue
        out.append(Unpacked(tensor, name, dequantizable(name)))
    return out


def check_unpacked(source: str, unpacked: list[Unpacked], *, strict: bool) -> None:
    """ValueError where a load cannot go on: under `--quantization gguf` (strict) any matrix that would
    not stay packed; under any setting one nothing here reads. `source` names the file."""
    unreadable = [u for u in unpacked if not u.dequantizable]
    if unreadable:
        raise ValueError(
            f"{source}: {_listed(unreadable)}: neither the quantized kernel nor the gguf package's "
            f"dequantizer reads {'this type' if len({u.type_name for u in unreadable}) == 1 else 'these types'}"
            f" (the kernel runs {', '.join(KERNEL_TYPES)}; F32 is read as stored)"
        )
    if strict and unpacked:
        raise ValueError(
            f"--quantization gguf: {source}: {_listed(unpacked)}: not a type the quantized kernel runs "
            f"({', '.join(KERNEL_TYPES)}); --quantization auto dequantizes such weights to float32"
        )


def describe(unpacked: list[Unpacked]) -> str:
    """For the log: `3 matrices dequantized to float32: blk.0.attn_q.weight (IQ2_XXS), ...`."""
    return f"{len(unpacked)} matrices dequantized to float32: {_listed(unpacked)}"


def _listed(unpacked: list[Unpacked], most: int = 6) -> str:
    shown = ", ".join(f"{u.tensor} ({u.type_name})" for u in unpacked[:most])
    return shown + (f" and {len(unpacked) - most} more" if len(unpacked) > most else "")
