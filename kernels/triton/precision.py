"""How our kernels multiply tiles: fp32 accumulation everywhere, fp32 inputs where it matters."""

from __future__ import annotations

import triton
import triton.knobs
import triton.language as tl

# Read once at import: triton decides interpreter-vs-compiler from the same variable, also at import.
INTERPRETING: bool = bool(triton.knobs.runtime.interpret)


def dot_in_fp32(dtype_is_fp32: bool) -> bool:
    """Whether tile products should upcast their inputs to fp32 (and use exact ieee fp32 products).

    The interpreter's tl.dot returns garbage on bf16 inputs, so it always upcasts. On a GPU, fp16/bf16
    tiles go to the tensor cores as they are; fp32 tiles use "ieee" rather than the default tf32,
    whose 10-bit mantissa would make an fp32 cache no more exact than a bf16 one.
    """
    return INTERPRETING or dtype_is_fp32


@triton.jit
def tile_dot(a, b, UPCAST: tl.constexpr):
    """a @ b with an fp32 result; see dot_in_fp32 for when UPCAST is set."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, out_dtype=tl.float32)
