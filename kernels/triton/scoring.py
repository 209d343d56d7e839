"""A layer's score rules inside the Triton kernels: the logit softcap (Gemma 2), as the C++ kernel has it.

Scores reach the softmax in log2 units (the kernels use exp2): s * scale * log2(e) plain, and
softcap * tanh(s * scale / softcap) * log2(e) capped. The sliding window is a bound on the positions
each kernel reads, so it lives in the kernels' loops, not here.
"""

from __future__ import annotations

import triton
import triton.language as tl

# A constexpr: the compiler reads no other globals from inside a kernel (the interpreter does).
LOG2_E = tl.constexpr(1.4426950408889634)


@triton.jit
def tanh(x):
    """tanh without libdevice (the interpreter has none): an odd polynomial below |x| = 0.625, where
    1 - e would cancel, (1 - e) / (1 + e) with e = exp(-2|x|) above; the C++ kernel's tanh_approx."""
    a = tl.abs(x)
    z = x * x
    p = -5.70498872745e-3 * z + 2.06390887954e-2
    p = p * z - 5.37397155531e-2
    p = p * z + 1.33314422036e-1
    p = p * z - 3.33332819422e-1
    small = a + a * z * p
    e = tl.exp(-2.0 * a)
    large = (1.0 - e) / (1.0 + e)
    t = tl.where(a < 0.625, small, large)
    return tl.where(x < 0.0, -t, t)


@triton.jit
def log2_scores(dots, scale_log2, scale, softcap, HAS_SOFTCAP: tl.constexpr):
    """q . k products -> the scores the exp2 softmax takes (scale_log2 = scale * log2(e))."""
    if HAS_SOFTCAP:
        return softcap * tanh(dots * (scale / softcap)) * LOG2_E
    else:
        return dots * scale_log2
